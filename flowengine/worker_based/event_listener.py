"""Turns an engine's flow and atom notifications into events for an EventSink.

Works with any engine: ``with EventListener(engine, EventPublisher("my-exchange", url)):``.
The worker-based engine attaches one itself (option ``events``) with ``task_events=False``,
because its workers report task-started/succeeded/failed; the engine then reports only what
no worker can (flows, reverts, and failures it decided: a lost worker, a time limit, a request
nobody took).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flowengine import states
from flowengine.listeners import base
from flowengine.listeners.atoms import redacted_failure
from flowengine.types.failure import Failure
from flowengine.worker_based import extensions as ext

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine

FLOW_EVENTS = {
    states.RUNNING: "flow-started",
    states.SUCCESS: "flow-succeeded",
    states.FAILURE: "flow-failed",
    states.REVERTED: "flow-reverted",
    states.SUSPENDED: "flow-suspended",
}
TASK_EVENTS = {
    states.RUNNING: "task-started",
    states.SUCCESS: "task-succeeded",
    states.FAILURE: "task-failed",
    states.REVERTED: "task-reverted",
    states.REVERT_FAILURE: "task-revert-failed",
}
#: Task events a worker reports for remote tasks (the engine leaves them to it).
WORKER_REPORTED = frozenset({states.RUNNING, states.SUCCESS, states.FAILURE})
#: Failures the engine decides for a remote task; no worker reports them.
ENGINE_DECIDED = ("WorkerLost", "RequestTimeout", "TaskTimeLimitExceeded")
#: A flow only counts as suspended when it was running (preparing also passes SUSPENDED).
_SUSPENDED_FROM = frozenset({states.RUNNING, states.SUSPENDING})


def failure_fields(engine: ActionEngine, atom_name: str, failure: Failure) -> dict[str, Any]:
    """A failure as event fields: its type and its message with the atom's secrets masked."""
    redacted = redacted_failure(engine, atom_name, failure)
    names = redacted.exc_type_names
    return {"exc_type": names[0] if names else None, "exception": redacted.exception_str}


class EventListener(base.Listener):
    """Emits flow-* and task-* events for an engine's state changes.

    Args:
        engine: The engine to listen to.
        sink: Where the events go (an EventPublisher, a MetricsSink, a FanoutSink...).
        task_events: Also emit task-started/succeeded/failed (False when workers do).
        clock: Monotonic seconds, for durations and runtimes.
    """

    def __init__(self, engine: ActionEngine, sink: ext.EventSink, *, task_events: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(engine, task_listen_for=base.DEFAULT_LISTEN_FOR,
                         flow_listen_for=tuple(FLOW_EVENTS), retry_listen_for=())
        self._sink, self._task_events, self._clock = sink, task_events, clock
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()

    def _elapsed(self, key: str, state: str, starting: frozenset[str]) -> float | None:
        with self._lock:
            if state in starting:
                self._started[key] = self._clock()
                return None
            started = self._started.pop(key, None)
        return None if started is None else self._clock() - started

    def _flow_receiver(self, state: str, details: base.Details) -> None:
        if state == states.SUSPENDED and details.get("old_state") not in _SUSPENDED_FROM:
            return
        fields: dict[str, Any] = {"flow_uuid": details["flow_uuid"],
                                  "flow_name": details["flow_name"]}
        duration = self._elapsed("flow", state, frozenset({states.RUNNING}))
        if duration is not None:
            fields["duration"] = duration
        if state in (states.FAILURE, states.REVERTED):
            failures = self._engine.storage.get_execute_failures()
            if failures:
                name, failure = next(iter(failures.items()))
                fields.update(failure_fields(self._engine, name, failure), failed_atom=name,
                              failed_atoms=sorted(failures))
        self._sink.emit(FLOW_EVENTS[state], **fields)

    def _task_receiver(self, state: str, details: base.Details) -> None:
        name, atom_uuid = details["task_name"], details["task_uuid"]
        runtime = self._elapsed(atom_uuid, state, frozenset({states.RUNNING, states.REVERTING}))
        event_type = TASK_EVENTS.get(state)
        if event_type is None:
            return
        result = details.get("result")
        fields: dict[str, Any] = {"flow_uuid": self._engine.storage.flow_uuid,
                                  "atom_uuid": atom_uuid, "task_name": name}
        if isinstance(result, Failure):
            fields.update(failure_fields(self._engine, name, result))
        if not self._task_events and state in WORKER_REPORTED:
            kind = str(fields.get("exc_type") or "")
            if state != states.FAILURE or not kind.endswith(ENGINE_DECIDED):
                return
            fields["origin"] = "engine"
        fields["action"] = "revert" if state in (states.REVERTED, states.REVERT_FAILURE) \
            else "execute"
        placement = getattr(self._engine, "atom_placement", None)
        if placement is not None:
            fields["attempt"], fields["worker"] = placement(atom_uuid)
        if runtime is not None:
            fields["runtime"] = runtime
        self._sink.emit(event_type, **fields)


class PlacementSink(ext.EventSink):
    """Remembers each atom's latest attempt number and worker from task-sent events."""

    def __init__(self) -> None:
        self._placed: dict[str, tuple[int | None, str | None]] = {}

    def emit(self, event_type: str, **fields: object) -> None:
        if event_type == "task-sent" and isinstance(fields.get("atom_uuid"), str):
            attempt = fields.get("attempt")
            worker = fields.get("worker")
            self._placed[str(fields["atom_uuid"])] = (
                attempt if isinstance(attempt, int) else None,
                worker if isinstance(worker, str) else None)

    def __call__(self, atom_uuid: str) -> tuple[int | None, str | None]:
        return self._placed.get(atom_uuid, (None, None))
