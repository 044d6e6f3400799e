"""A SQLite store with flows for the dashboard tests (a module of its own: test modules import
it by name, and ``conftest`` names are ambiguous in a whole-suite run)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.engines.factory_policy import FactoryPolicy
from flowengine.persistence import backends, base, models

PASSWORD = "hunter2-very-secret"
#: The dashboard may rebuild (draw, resume) flows whose factories are in the tests' flow module.
FACTORIES = FactoryPolicy.from_names("dashboard_flows")


def open_store(path: Path | str) -> base.Backend:
    """A SQLite backend at ``path`` (or the backend a URI string names), created and upgraded."""
    backend = backends.fetch(path if isinstance(path, str) else f"sqlite:///{path}")
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    return backend


def store_run(backend: base.Backend, factory: Any, book: models.LogBook | None = None,
              **engine_options: Any) -> str:
    """Run ``factory``'s flow (the engine stores its timings) with the factory saved; return
    its uuid."""
    book = book or models.LogBook("dashboard-tests")
    engine = engines.load_from_factory(factory, store={"user": "ada", "password": PASSWORD},
                                       book=book, backend=backend, **engine_options)
    with contextlib.suppress(exc.WrappedFailure, RuntimeError):
        engine.run()
    return str(engine.storage.flow_uuid)


def store_suspended(backend: base.Backend, factory: Any, store: dict[str, Any]) -> Any:
    """Save ``factory``'s flow as SUSPENDED before any atom ran; return its storage."""
    from flowengine import states

    engine = engines.load_from_factory(factory, store=store, book=models.LogBook("resumable"),
                                       backend=backend)
    engine.compile()
    engine.prepare()
    engine.storage.set_flow_state(states.SUSPENDED)
    return engine.storage
