"""Fixtures of the engine behaviour suite: every scenario runs once per engine.

A new engine joins by adding a param to ``ENGINES`` and teaching :class:`EngineFactory` how to
load it. The worker-based engine runs its tasks on one session-wide :class:`Worker` thread over
kombu's in-process ``memory`` transport, serving every class in ``tasks.py``.

Scenarios whose atoms cannot run remotely *by TaskFlow's own definition* use
``local_engine_factory`` instead of ``engine_factory``: a remote worker rebuilds a task from its
class name and ``name`` alone (TaskFlow's ``endpoint.generate``), so these cannot travel:

- ``FunctorTask`` / ``MapFunctorTask`` / ``ReduceFunctorTask``: their behaviour is a function
  given to the constructor (TaskFlow's worker cannot build them either);
- tasks defined inside a test or needing constructor state of their own (TaskFlow excludes
  ``EngineCheckingTaskTest`` from its WBE runs for exactly this reason).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from flowengine import engines

from . import tasks

ENGINES = ["serial", "parallel", "worker-based"]
#: Engines that run independent atoms at the same time.
CONCURRENT_ENGINES = ["parallel", "worker-based"]
#: Engines that run atoms in this process: the only ones for atoms that cannot travel.
LOCAL_ENGINES = ["serial", "parallel"]

#: Task threads of the in-process worker: more than any scenario runs at once.
WORKER_THREADS = 16
#: Seconds the in-process worker gets to start serving.
WORKER_START_TIMEOUT = 30.0
#: Seconds a worker-based request may wait to be taken (nothing legitimate comes close).
TRANSITION_TIMEOUT = 10.0


class InProcessWorker:
    """A :class:`Worker` on its own thread and exchange, over kombu's ``memory`` transport."""

    topic = "behaviour"
    transport = "memory"

    def __init__(self) -> None:
        from flowengine.worker_based.worker import Worker

        self.exchange = f"behaviour-{uuid.uuid4().hex[:8]}"
        self.worker = Worker(
            self.exchange, self.topic, tasks=[tasks.__name__],
            threads_count=WORKER_THREADS, transport=self.transport,
        )  # fmt: skip
        self._thread = threading.Thread(
            target=self.worker.run, kwargs={"display_banner": False},
            name="behaviour-worker", daemon=True,
        )  # fmt: skip

    def start(self) -> None:
        self._thread.start()
        if not self.worker.wait(WORKER_START_TIMEOUT):
            raise RuntimeError(f"in-process worker did not serve within {WORKER_START_TIMEOUT}s")

    def stop(self) -> None:
        self.worker.stop(grace=5.0)
        self._thread.join(timeout=10.0)

    def engine_options(self) -> dict[str, Any]:
        """What ``engines.load`` needs to run tasks on this worker."""
        return {
            "exchange": self.exchange, "topics": [self.topic], "transport": self.transport,
            # A task no worker runs fails in seconds instead of TaskFlow's default minute.
            "transition_timeout": TRANSITION_TIMEOUT,
        }  # fmt: skip


class EngineFactory:
    """Loads flows into one kind of engine: ``factory(flow, store=..., **options)``."""

    def __init__(self, kind: str, defaults: dict[str, Any] | None = None) -> None:
        self.kind = kind
        self.defaults = dict(defaults or {})

    @property
    def remote(self) -> bool:
        """Whether tasks run in a worker, not in the engine's process."""
        return self.kind == "worker-based"

    def __call__(self, flow: Any, store: dict[str, Any] | None = None, **options: Any) -> Any:
        return engines.load(flow, store=store, engine=self.kind, **{**self.defaults, **options})

    def run(self, flow: Any, store: dict[str, Any] | None = None, **options: Any) -> Any:
        """Load and run ``flow``; return the engine (to inspect its storage)."""
        engine = self(flow, store=store, **options)
        engine.run()
        return engine

    def __repr__(self) -> str:
        return f"<EngineFactory {self.kind}>"


@pytest.fixture(scope="session")
def behaviour_worker() -> Iterator[InProcessWorker]:
    """The worker every worker-based scenario's tasks run on (started once per session)."""
    worker = InProcessWorker()
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


def _factory(request: pytest.FixtureRequest, kind: str) -> EngineFactory:
    if kind != "worker-based":
        return EngineFactory(kind)
    worker: InProcessWorker = request.getfixturevalue("behaviour_worker")
    return EngineFactory(kind, worker.engine_options())


@pytest.fixture(params=ENGINES)
def engine_factory(request: pytest.FixtureRequest) -> EngineFactory:
    """One engine kind per param; scenarios call it like ``engines.load``."""
    return _factory(request, request.param)


@pytest.fixture(params=CONCURRENT_ENGINES)
def concurrent_engine_factory(request: pytest.FixtureRequest) -> EngineFactory:
    """Engines whose independent atoms really run at the same time."""
    return _factory(request, request.param)


@pytest.fixture(params=LOCAL_ENGINES)
def local_engine_factory(request: pytest.FixtureRequest) -> EngineFactory:
    """Engines for atoms that cannot run remotely (see the module docstring for which)."""
    return _factory(request, request.param)


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
