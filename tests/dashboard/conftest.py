"""Fixtures of the dashboard tests: a SQLite store (or a MariaDB one, with the cluster suite),
and one holding two finished flows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dashboard_flows as df
import pytest
from dashboard_store import open_store, store_run

from flowengine.persistence import base


@pytest.fixture(params=["sqlite", pytest.param("mariadb", marks=pytest.mark.cluster)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[base.Backend]:
    """An empty store: a SQLite file, or a MariaDB database (the pages' queries must mean the
    same there, keyset pages included)."""
    where = (request.getfixturevalue("mariadb_database_url") if request.param == "mariadb"
             else tmp_path / "flows.db")
    backend = open_store(where)
    yield backend
    backend.close()


@pytest.fixture
def stored(store: base.Backend) -> dict[str, str]:
    """Flow uuids by name: ``provisioning`` succeeded, ``exploding`` failed and reverted."""
    return {"provisioning": store_run(store, df.provisioning),
            "exploding": store_run(store, df.exploding)}
