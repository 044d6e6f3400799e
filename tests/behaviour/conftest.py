"""Fixtures of the engine behaviour suite: every scenario runs once per engine.

A new engine joins by adding a param to ``ENGINES`` and teaching :func:`_factory` how to load it
(``harness.EngineFactory``). The worker-based engine runs its tasks on one session-wide worker
thread over kombu's in-process ``memory`` transport, serving every class in ``tasks.py``.

Scenarios whose atoms cannot run remotely *by TaskFlow's own definition* use
``local_engine_factory`` instead of ``engine_factory``: a remote worker rebuilds a task from its
class name and ``name`` alone (TaskFlow's ``endpoint.generate``), so these cannot travel:

- ``FunctorTask`` / ``MapFunctorTask`` / ``ReduceFunctorTask``: their behaviour is a function
  given to the constructor (TaskFlow's worker cannot build them either);
- tasks defined inside a test or needing constructor state of their own (TaskFlow excludes
  ``EngineCheckingTaskTest`` from its WBE runs for exactly this reason). None do today: every
  class in ``tasks.py`` is built from its name alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import tasks
from .harness import EngineFactory, InProcessWorker

ENGINES = ["serial", "parallel", "worker-based"]
#: Engines that run independent atoms at the same time.
CONCURRENT_ENGINES = ["parallel", "worker-based"]
#: Engines that run atoms in this process: the only ones for atoms that cannot travel.
LOCAL_ENGINES = ["serial", "parallel"]

#: Task threads of the in-process worker: more than any scenario runs at once.
WORKER_THREADS = 16


@pytest.fixture(scope="session")
def behaviour_worker() -> Iterator[InProcessWorker]:
    """The worker every worker-based scenario's tasks run on (started once per session)."""
    worker = InProcessWorker(threads=WORKER_THREADS)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="session")
def one_thread_worker() -> Iterator[InProcessWorker]:
    """A worker with a single task thread, on an exchange of its own."""
    worker = InProcessWorker(threads=1)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


def _factory(request: pytest.FixtureRequest, kind: str) -> EngineFactory:
    if kind != "worker-based":
        return EngineFactory(kind)
    worker: InProcessWorker = request.getfixturevalue("behaviour_worker")
    return EngineFactory(
        kind, worker.engine_options(), task_threads=worker.task_threads,
        one_at_a_time=lambda: request.getfixturevalue("one_thread_worker").engine_options(),
    )  # fmt: skip


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
    """A fresh ledger and fresh in-process barriers for every test."""
    fresh = tasks.MemoryLedger()
    previous = tasks.use_ledger(fresh)
    previous_barriers = tasks.use_barriers(tasks.LocalBarriers())
    try:
        yield fresh
    finally:
        tasks.clear_barriers()
        tasks.use_barriers(previous_barriers)
        tasks.use_ledger(previous)
