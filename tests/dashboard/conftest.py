"""Fixtures of the dashboard tests: a SQLite store, and one holding two finished flows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dashboard_flows as df
import pytest
from dashboard_store import open_store, store_run

from flowengine.persistence import base


@pytest.fixture
def store(tmp_path: Path) -> Iterator[base.Backend]:
    """An empty SQLite store."""
    backend = open_store(tmp_path / "flows.db")
    yield backend
    backend.close()


@pytest.fixture
def stored(store: base.Backend) -> dict[str, str]:
    """Flow uuids by name: ``provisioning`` succeeded, ``exploding`` failed and reverted."""
    return {"provisioning": store_run(store, df.provisioning),
            "exploding": store_run(store, df.exploding)}
