"""Engine hooks: attach your own code to every run, task call and failure decision.

A hook times each local task call (on the thread that runs it) and writes down how the run's
failures were resolved. Part 1 adds it to the process's defaults for one engine: the atom log
and tracing stay, and log the failed first try, its revert and the retry. Part 2 runs another
engine with the hook alone: it still sees the call, and no atom log line appears. Part 3 sends a
serial engine's events to a sink of its own through ``EventHook`` (what the worker-based engine
attaches for its ``events`` option), and a ``whole_run`` hook reads the stored end state. Part 4
gives a worker (a thread of this process, on kombu's memory transport) a hook of its own: it
hears each request the worker serves and the outcome it replies, where tracing attaches on a
worker.

Run: python examples/engine_hooks.py
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from flowengine import engines, hooks, retry, task
from flowengine.engines.engine import ActionEngine
from flowengine.flows import linear_flow
from flowengine.worker_based.event_listener import EventHook
from flowengine.worker_based.extensions import EventSink
from flowengine.worker_based.worker import Worker


class Reserve(task.Task):
    """Reserves a seat; the first try in this process finds the booking system busy."""

    tries = 0

    def execute(self) -> str:
        Reserve.tries += 1
        if Reserve.tries == 1:
            raise ConnectionError("the booking system is busy")
        return "12A"


class Timing(hooks.Hook):
    """Writes down how long each task call took, and each failure's resolution."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.decisions: list[str] = []

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.calls.append((name, time.perf_counter() - began))

    def call(self, task: Any) -> contextlib.AbstractContextManager[None]:
        return self._timed(task.name)

    def failure_resolved(self, atom_uuid: str, decision: object, retry: Any) -> None:
        self.decisions.append(f"{decision} by {retry.name if retry else 'nobody'}")


class Printed(EventSink):
    """Prints each event's type (an EventPublisher would send it to the broker)."""

    def emit(self, event_type: str, **fields: object) -> None:
        print("event:", event_type)


class EndState(hooks.Hook):
    """Prints the flow's stored state once the whole run is over."""

    @contextlib.contextmanager
    def _reported(self, engine: ActionEngine) -> Iterator[None]:
        try:
            yield
        finally:
            print("stored end state:", engine.storage.get_flow_state())

    def whole_run(self, engine: ActionEngine) -> contextlib.AbstractContextManager[None]:
        return self._reported(engine)


class Served(hooks.Hook):
    """On a worker: writes down each request it serves and the outcome it replies."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def serving(self, headers: Any, *, task_name: str, worker: str, request_id: str | None,
                attempt: int | None, topic: str) -> None:
        self.seen.append(f"serve {task_name} (attempt {attempt}, topic {topic})")

    def replying(self, state: str, event_type: str | None) -> None:
        if state in ("SUCCESS", "FAILURE"):
            self.seen.append(f"reply {state}")


def on_a_worker() -> None:
    served = Served()
    worker = Worker("hooks-example", "booking", [Reserve], threads_count=1, transport="memory",
                    events=False, hooks=[served])
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        if not worker.wait(timeout=10):
            raise SystemExit("the worker did not start")
        engines.run(flow(), engine="worker-based", exchange="hooks-example", topics=["booking"],
                     transport="memory", hooks=[])
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)
    print("the worker's hook:", served.seen)


def flow() -> linear_flow.Flow:
    return linear_flow.Flow("booking", retry=retry.Times(2, name="again")).add(Reserve("reserve"))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stdout)
    timing = Timing()
    engine = engines.load(flow(), hooks=[*hooks.defaults, timing])
    print("hooks:", [type(hook).__name__ for hook in engine.hooks])
    engine.run()
    print("calls:", [name for name, _seconds in timing.calls])
    print("decisions:", timing.decisions)

    alone = Timing()
    engines.run(flow(), engine="parallel", hooks=[alone])
    print("without the atom log:", [name for name, _seconds in alone.calls])

    engines.run(flow(), hooks=[EndState(), EventHook(Printed())])

    on_a_worker()


if __name__ == "__main__":
    main()
