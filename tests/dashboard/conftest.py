"""Fixtures of the dashboard tests: a SQLite store with flows, the data interface, an app."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dashboard_flows as df
import pytest

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.listeners.timing import EventTimeListener
from flowengine.persistence import backends, base, models

PASSWORD = "hunter2-very-secret"


def open_store(path: Path) -> base.Backend:
    """A SQLite backend at ``path``, created and upgraded."""
    backend = backends.fetch(f"sqlite:///{path}")
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    return backend


def store_run(backend: base.Backend, factory: Any, book: models.LogBook | None = None,
              **engine_options: Any) -> str:
    """Run ``factory``'s flow with timings stored and the factory saved; return its uuid."""
    book = book or models.LogBook("dashboard-tests")
    engine = engines.load_from_factory(factory, store={"user": "ada", "password": PASSWORD},
                                       book=book, backend=backend, **engine_options)
    with EventTimeListener(engine), contextlib.suppress(exc.WrappedFailure, RuntimeError):
        engine.run()
    return str(engine.storage.flow_uuid)


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
