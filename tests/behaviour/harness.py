"""How the behaviour scenarios load engines, shared with the integration tests.

:class:`EngineFactory` is what scenarios receive as ``engine_factory``: it loads a flow into one
kind of engine with the options that engine needs (for the worker-based engine: where its
workers are). :class:`InProcessWorker` is a worker on a thread over kombu's ``memory`` transport;
the integration tests build factories for worker processes on real brokers instead.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flowengine import engines
from flowengine import exceptions as exc

from . import async_tasks, tasks

#: Engine kinds whose tasks run in a worker, not in the engine's process.
REMOTE_KINDS = frozenset({"worker-based", "workers"})
#: Seconds a worker-based request may wait to be taken: a task no worker runs fails in seconds
#: instead of TaskFlow's default minute (nothing legitimate comes close).
TRANSITION_TIMEOUT = 10.0


class EngineFactory:
    """Loads flows into one kind of engine: ``factory(flow, store=..., **options)``.

    Args:
        kind: The engine name given to ``engines.load``.
        options: Options every load gets (the worker-based engine's exchange, topics, broker).
        one_at_a_time: Gives the options under which this engine runs one task at a time (see
            :meth:`one_at_a_time`); called only by the scenarios that need it.
        task_threads: Thread-name prefix of the threads remote tasks run on, if known.
    """

    def __init__(
        self, kind: str, options: dict[str, Any] | None = None,
        one_at_a_time: Callable[[], dict[str, Any]] | None = None,
        task_threads: str | None = None,
    ) -> None:  # fmt: skip
        self.kind = kind
        self.options = dict(options or {})
        self._one_at_a_time = one_at_a_time
        self.task_threads = task_threads

    @property
    def remote(self) -> bool:
        """Whether tasks run in a worker, not in the engine's process."""
        return self.kind in REMOTE_KINDS

    def __call__(self, flow: Any, store: dict[str, Any] | None = None, **options: Any) -> Any:
        return engines.load(flow, store=store, engine=self.kind, **{**self.options, **options})

    def run(self, flow: Any, store: dict[str, Any] | None = None, **options: Any) -> Any:
        """Load and run ``flow``; return the engine (to inspect its storage)."""
        engine = self(flow, store=store, **options)
        engine.run()
        return engine

    def one_at_a_time(self) -> dict[str, Any]:
        """Options under which the engine runs one task at a time, in the order it starts them.

        One thread for the parallel engine; for the worker-based engine, a worker with one
        thread (it takes requests from its queue in the order they were sent).
        """
        if self._one_at_a_time is not None:
            return self._one_at_a_time()
        if self.remote:
            raise NotImplementedError(f"{self!r} has no one-task-at-a-time worker")
        return {"max_workers": 1} if self.kind == "parallel" else {}

    @contextlib.contextmanager
    def raises(self, exc_type: type[BaseException], match: str | None = None) -> Iterator[Any]:
        """Expect the run to fail because a *task* raised ``exc_type`` (message ``match``).

        In-process engines re-raise the task's own exception. A remote task's failure comes
        back as data (its type is never imported from a message), so, as in TaskFlow, the
        worker-based engine raises ``WrappedFailure`` holding that one failure.
        """
        if not self.remote:
            with pytest.raises(exc_type, match=match) as caught:
                yield caught
            return
        with pytest.raises(exc.WrappedFailure) as caught:
            yield caught
        failures = list(caught.value)
        assert len(failures) == 1, f"expected one failure, got {failures}"
        [failure] = failures
        assert failure.check(exc_type), f"{failure} is not a {exc_type.__name__}"
        if match is not None:
            assert re.search(match, failure.exception_str), (
                f"{failure.exception_str!r} does not match {match!r}")

    def __repr__(self) -> str:
        return f"<EngineFactory {self.kind}>"


class InProcessWorker:
    """A :class:`Worker` on its own thread and exchange, over kombu's ``memory`` transport.

    Args:
        threads: Task threads (named ``<exchange>-task-N``).
    """

    topic = "behaviour"
    transport = "memory"
    #: Seconds the worker gets to start serving, and to stop.
    START_TIMEOUT = 30.0
    STOP_TIMEOUT = 10.0

    def __init__(self, threads: int) -> None:
        from flowengine.worker_based.worker import Worker

        self.exchange = f"behaviour-{uuid.uuid4().hex[:8]}"
        self.task_threads = f"{self.exchange}-task"
        self._pool = cf.ThreadPoolExecutor(threads, thread_name_prefix=self.task_threads)
        self.worker = Worker(
            self.exchange, self.topic, tasks=[tasks.__name__, async_tasks.__name__],
            executor=self._pool,
            threads_count=threads, transport=self.transport,
        )  # fmt: skip
        self._thread = threading.Thread(
            target=self.worker.run, kwargs={"display_banner": False},
            name=f"{self.exchange}-consumer", daemon=True,
        )  # fmt: skip

    def start(self) -> None:
        """Start serving; raise if the worker does not consume within ``START_TIMEOUT``."""
        self._thread.start()
        if not self.worker.wait(self.START_TIMEOUT):
            raise RuntimeError(f"worker on {self.exchange!r} did not start consuming within "
                               f"{self.START_TIMEOUT}s")

    def stop(self) -> None:
        """Stop serving and release the task threads."""
        self.worker.stop(grace=self.STOP_TIMEOUT / 2)
        self._thread.join(timeout=self.STOP_TIMEOUT)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def engine_options(self) -> dict[str, Any]:
        """What ``engines.load`` needs to run tasks on this worker."""
        return {
            "exchange": self.exchange, "topics": [self.topic], "transport": self.transport,
            "transition_timeout": TRANSITION_TIMEOUT,
        }  # fmt: skip
