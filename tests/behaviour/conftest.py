"""Fixtures of the engine behaviour suite: every scenario runs once per engine.

A new engine (the worker-based one, say) joins by adding a param to ``ENGINES`` and teaching
:class:`EngineFactory` how to load it (start its workers with the classes in ``tasks.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flowengine import engines

from . import tasks

ENGINES = ["serial", "parallel"]
#: Engines that run independent atoms at the same time.
CONCURRENT_ENGINES = ["parallel"]


class EngineFactory:
    """Loads flows into one kind of engine: ``factory(flow, store=..., **options)``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, flow: Any, store: dict[str, Any] | None = None, **options: Any) -> Any:
        return engines.load(flow, store=store, engine=self.kind, **options)

    def run(self, flow: Any, store: dict[str, Any] | None = None, **options: Any) -> Any:
        """Load and run ``flow``; return the engine (to inspect its storage)."""
        engine = self(flow, store=store, **options)
        engine.run()
        return engine

    def __repr__(self) -> str:
        return f"<EngineFactory {self.kind}>"


@pytest.fixture(params=ENGINES)
def engine_factory(request: pytest.FixtureRequest) -> EngineFactory:
    """One engine kind per param; scenarios call it like ``engines.load``."""
    return EngineFactory(request.param)


@pytest.fixture(params=CONCURRENT_ENGINES)
def concurrent_engine_factory(request: pytest.FixtureRequest) -> EngineFactory:
    """Engines whose independent atoms really run at the same time."""
    return EngineFactory(request.param)


@pytest.fixture(autouse=True)
def ledger() -> Iterator[tasks.MemoryLedger]:
    """A fresh ledger (and no leftover barriers) for every test."""
    fresh = tasks.MemoryLedger()
    previous = tasks.use_ledger(fresh)
    try:
        yield fresh
    finally:
        tasks.use_ledger(previous)
        tasks.clear_barriers()
