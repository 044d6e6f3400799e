"""Turns an engine's flow, atom and progress notifications into events for an EventSink.

Works with any engine: ``with EventListener(engine, EventPublisher("my-exchange", url)):``, or
as an engine hook, :class:`EventHook`. The worker-based engine attaches one itself (option
``events``) with ``task_events=False``,
because its workers report task-started/succeeded/failed; the engine then reports only what
no worker can (flows, reverts, retry controllers, progress, and failures it decided: a lost
worker, a time limit, a request nobody took). Progress is reported here, never by workers:
remote progress reaches the engine's task notifier too, so each update is one event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flowengine import hooks, states
from flowengine.listeners import base
from flowengine.listeners.atoms import redacted_failure
from flowengine.task import EVENT_UPDATE_PROGRESS, Task
from flowengine.types.failure import Failure
from flowengine.types.notifier import Notifier
from flowengine.worker_based import extensions as ext

if TYPE_CHECKING:
    from flowengine.engines.delays import RetryWait
    from flowengine.engines.engine import ActionEngine

LOG = logging.getLogger(__name__)

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
#: Events of an operator's interventions (the engine's ``interventions`` notifier).
INTERVENTION_EVENTS = {"cancelled": "flow-cancelled", "repaired": "flow-repaired"}
_INTERVENTION_FIELDS = frozenset(("flow_uuid", "flow_name", "reason", "by", "at", "action",
                                  "atom", "atoms"))
#: Task events a worker reports for remote tasks (the engine leaves them to it).
WORKER_REPORTED = frozenset({states.RUNNING, states.SUCCESS, states.FAILURE})
#: Failures the engine decides for a remote task; no worker reports them.
ENGINE_DECIDED = ("WorkerLost", "RequestTimeout", "TaskTimeLimitExceeded")
#: Where an atom's work starts (progress is the task's own from then on until it ends).
_STARTING = frozenset({states.RUNNING, states.REVERTING})
#: A flow only counts as suspended when it was running (preparing also passes SUSPENDED).
_SUSPENDED_FROM = frozenset({states.RUNNING, states.SUSPENDING})


def failure_fields(engine: ActionEngine, atom_name: str, failure: Failure) -> dict[str, Any]:
    """A failure as event fields: its type and its message with the atom's secrets masked."""
    redacted = redacted_failure(engine, atom_name, failure)
    names = redacted.exc_type_names
    return {"exc_type": names[0] if names else None, "exception": redacted.exception_str}


class EventListener(base.Listener):
    """Emits flow-* and task-* events for an engine's state changes, retries and progress.

    Retry controllers report as tasks do (their ``task_name`` is the controller's, with
    ``kind="retry"``), and ``task-retried`` when one decides to retry its subflow.

    Args:
        engine: The engine to listen to.
        sink: Where the events go (an EventPublisher, a MetricsSink, a FanoutSink...).
        task_events: Also emit task-started/succeeded/failed (False when workers do).
        clock: Monotonic seconds, for durations and runtimes.
    """

    def __init__(self, engine: ActionEngine, sink: ext.EventSink, *, task_events: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(engine, task_listen_for=base.DEFAULT_LISTEN_FOR,
                         # One registration for every flow state (filtered in _flow_receiver)
                         # rather than one per state: an engine per flow registers it per run.
                         flow_listen_for=base.DEFAULT_LISTEN_FOR,
                         retry_listen_for=base.DEFAULT_LISTEN_FOR)
        self._sink, self._task_events, self._clock = sink, task_events, clock
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()
        #: Tasks whose notifier reaches :meth:`_on_progress`, by name.
        self._watched: dict[str, Any] = {}
        #: Action of each task working now, and those whose next 0.0 is the engine's own.
        self._working: dict[str, str] = {}
        self._opening: set[str] = set()

    def register(self) -> None:
        super().register()
        waits = getattr(self._engine, "retry_waits", None)
        if waits is not None:
            waits.subscribe(self._on_wait)
        interventions = getattr(self._engine, "interventions", None)
        if interventions is not None:
            interventions.register(Notifier.ANY, self._on_intervention)

    def deregister(self) -> None:
        super().deregister()
        waits = getattr(self._engine, "retry_waits", None)
        if waits is not None:
            waits.unsubscribe(self._on_wait)
        interventions = getattr(self._engine, "interventions", None)
        if interventions is not None:
            interventions.deregister(Notifier.ANY, self._on_intervention)
        with self._lock:
            watched, self._watched = self._watched, {}
        for task in watched.values():
            task.notifier.deregister(EVENT_UPDATE_PROGRESS, self._on_progress)

    def _on_intervention(self, kind: str, details: base.Details) -> None:
        """A cancel applied (``flow-cancelled``) or a repair made (``flow-repaired``)."""
        event_type = INTERVENTION_EVENTS.get(kind)
        if event_type is not None:
            self._sink.emit(event_type, **{k: v for k, v in details.items()
                                           if k in _INTERVENTION_FIELDS})

    def _watch_progress(self) -> None:
        """Listen to every task's progress, once the engine has compiled its flow."""
        if self._watched:
            return
        compilation = getattr(self._engine, "compilation", None)
        tasks = [] if compilation is None else [
            a for a in compilation.iter_atoms() if isinstance(a, Task)]
        with self._lock:
            if self._watched:
                return
            for task in tasks:
                task.notifier.register(EVENT_UPDATE_PROGRESS, self._on_progress,
                                       args=(task.name,))
                self._watched[task.name] = task

    def _on_progress(self, _event: str, name: str, details: base.Details) -> None:
        progress = details.get("progress")
        with self._lock:
            action = self._working.get(name)
            opening = name in self._opening
            self._opening.discard(name)
        # The engine itself reports 0.0 as a task starts and 1.0 once it ended: not news.
        if action is None or (opening and progress == 0.0):
            return
        try:
            atom_uuid = self._engine.storage.get_atom_uuid(name)
            fields: dict[str, Any] = {"flow_uuid": self._engine.storage.flow_uuid,
                                      "atom_uuid": atom_uuid, "task_name": name,
                                      "action": action, "progress": progress}
            fields.update(self._placement(atom_uuid))
            self._sink.emit("task-progress", **fields)
        except Exception:  # runs on the task's thread: a listener must never fail the task
            LOG.warning("Could not report progress %r of task %r", progress, name,
                        exc_info=True)

    def _placement(self, atom_uuid: str) -> dict[str, Any]:
        placement = getattr(self._engine, "atom_placement", None)
        if placement is None:
            return {"attempt": 1}
        attempt, worker = placement(atom_uuid)
        return {"attempt": attempt, "worker": worker}

    def _elapsed(self, key: str, state: str, starting: frozenset[str]) -> float | None:
        with self._lock:
            if state in starting:
                self._started[key] = self._clock()
                return None
            started = self._started.pop(key, None)
        return None if started is None else self._clock() - started

    def _flow_receiver(self, state: str, details: base.Details) -> None:
        if state not in FLOW_EVENTS:
            return
        if state == states.SUSPENDED and details.get("old_state") not in _SUSPENDED_FROM:
            return
        if state == states.RUNNING:
            self._watch_progress()
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

    def _atom_fields(self, state: str, details: base.Details, name: str,
                     atom_uuid: str) -> dict[str, Any]:
        fields: dict[str, Any] = {"flow_uuid": self._engine.storage.flow_uuid,
                                  "atom_uuid": atom_uuid, "task_name": name}
        result = details.get("result")
        if isinstance(result, Failure):
            fields.update(failure_fields(self._engine, name, result))
        fields["action"] = "revert" if state in (states.REVERTED, states.REVERT_FAILURE) \
            else "execute"
        return fields

    def _task_receiver(self, state: str, details: base.Details) -> None:
        name, atom_uuid = details["task_name"], details["task_uuid"]
        with self._lock:
            if state in _STARTING:
                self._working[name] = "revert" if state == states.REVERTING else "execute"
                self._opening.add(name)
            else:
                self._working.pop(name, None)
                self._opening.discard(name)
        if state in _STARTING:
            self._watch_progress()
        runtime = self._elapsed(atom_uuid, state, _STARTING)
        event_type = TASK_EVENTS.get(state)
        if event_type is None:
            return
        fields = self._atom_fields(state, details, name, atom_uuid)
        if not self._task_events and state in WORKER_REPORTED:
            kind = str(fields.get("exc_type") or "")
            if state != states.FAILURE or not kind.endswith(ENGINE_DECIDED):
                return
            fields["origin"] = "engine"
        placement = getattr(self._engine, "atom_placement", None)
        if placement is not None:
            fields["attempt"], fields["worker"] = placement(atom_uuid)
        if runtime is not None:
            fields["runtime"] = runtime
        self._sink.emit(event_type, **fields)

    def _retry_receiver(self, state: str, details: base.Details) -> None:
        # Retry controllers always run in the engine: it reports them whoever runs tasks.
        name, atom_uuid = details["retry_name"], details["retry_uuid"]
        runtime = self._elapsed(atom_uuid, state, _STARTING)
        if state == states.RETRYING:
            self._sink.emit("task-retried", **self._retried_fields(name, atom_uuid))
            return
        event_type = TASK_EVENTS.get(state)
        if event_type is None:
            return
        fields = self._atom_fields(state, details, name, atom_uuid)
        fields["kind"] = "retry"
        if runtime is not None:
            fields["runtime"] = runtime
        self._sink.emit(event_type, **fields)

    def _on_wait(self, wait: RetryWait) -> None:
        """A retry's wait or a task's start delay started or resumed (``task-delayed``), or
        ended (``task-delay-ended``)."""
        storage = self._engine.storage
        fields: dict[str, Any] = {
            "flow_uuid": storage.flow_uuid, "atom_uuid": storage.get_atom_uuid(wait.retry_name),
            "task_name": wait.retry_name, "kind": wait.kind, "attempt": wait.attempt}
        if wait.due is None:
            self._sink.emit("task-delay-ended", **fields)
        else:
            self._sink.emit("task-delayed", delay=wait.seconds, due=wait.due, **fields)

    def _retry_delay(self, name: str, attempt: int) -> float:
        """Seconds retry controller ``name`` waits before ``attempt`` (its delay and backoff)."""
        compilation = getattr(self._engine, "compilation", None)
        atoms = [] if compilation is None else compilation.iter_atoms()
        controller = next((a for a in atoms if a.name == name), None)
        delay_before = getattr(controller, "delay_before", None)
        return float(delay_before(attempt)) if callable(delay_before) else 0.0

    def _retried_fields(self, name: str, atom_uuid: str) -> dict[str, Any]:
        """A RETRY decision: the attempt it starts and the failures that caused it."""
        history = self._engine.storage.get_retry_history(name)
        fields: dict[str, Any] = {
            "flow_uuid": self._engine.storage.flow_uuid, "atom_uuid": atom_uuid,
            "task_name": name, "kind": "retry", "decision": "RETRY",
            "history": len(history), "attempt": len(history) + 1,
            "delay": self._retry_delay(name, len(history) + 1)}
        failed = dict(history.outcomes_iter(len(history) - 1)) if len(history) else {}
        if failed:
            first, failure = next(iter(failed.items()))
            fields.update(failure_fields(self._engine, first, failure), failed_atom=first,
                          failed_atoms=sorted(failed))
        return fields


class EventHook(hooks.Hook):
    """An engine hook that sends each whole run's flow and atom events to ``sink``, through
    an :class:`EventListener` (so it hears the flow's end state too).

    Works with any engine: ``engines.load(flow, hooks=[*hooks.defaults, EventHook(sink)])``.

    Args:
        sink: Where the events go (an EventPublisher, a MetricsSink, a FanoutSink...).
        task_events: Also emit task-started/succeeded/failed (False when workers do).
    """

    def __init__(self, sink: ext.EventSink, *, task_events: bool = True) -> None:
        self.sink, self.task_events = sink, task_events

    def whole_run(self, engine: ActionEngine) -> EventListener:
        return EventListener(engine, self.sink, task_events=self.task_events)

    def __repr__(self) -> str:
        return f"EventHook({self.sink!r}, task_events={self.task_events})"


class PlacementSink(ext.EventSink):
    """Remembers where each atom's attempts ran, from task-sent, task-moved and task-lost events.

    Each attempt is ``{"attempt", "action", "worker", "outcome"}``; ``outcome`` is ``LOST``
    for an attempt whose lease lapsed or whose worker went away, else set by :meth:`settle`.
    """

    def __init__(self) -> None:
        self._attempts: dict[str, list[dict[str, Any]]] = {}
        self._settled: dict[str, int] = {}
        self._lock = threading.Lock()

    def emit(self, event_type: str, **fields: object) -> None:
        atom_uuid = fields.get("atom_uuid")
        if (event_type not in ("task-sent", "task-moved", "task-lost")
                or not isinstance(atom_uuid, str)):
            return
        attempt, worker = fields.get("attempt"), fields.get("worker")
        with self._lock:
            tried = self._attempts.setdefault(atom_uuid, [])
            if event_type == "task-sent":
                tried.append({"attempt": attempt if isinstance(attempt, int) else None,
                              "action": str(fields.get("action") or "execute"),
                              "worker": worker if isinstance(worker, str) else None,
                              "outcome": None})
            elif not tried or tried[-1]["attempt"] != attempt:
                return
            elif event_type == "task-moved":  # another worker of the topic took it
                tried[-1]["worker"] = worker if isinstance(worker, str) else None
            else:
                tried[-1]["outcome"] = "LOST"

    def __call__(self, atom_uuid: str) -> tuple[int | None, str | None]:
        """The latest attempt number and worker of ``atom_uuid`` (None where unknown)."""
        with self._lock:
            tried = self._attempts.get(atom_uuid)
            return (tried[-1]["attempt"], tried[-1]["worker"]) if tried else (None, None)

    def settle(self, atom_uuid: str, outcome: str) -> list[dict[str, Any]]:
        """The attempts of ``atom_uuid`` since the last call, the last one ending ``outcome``
        (unless it was lost)."""
        with self._lock:
            tried = self._attempts.get(atom_uuid, [])
            fresh = [dict(a) for a in tried[self._settled.get(atom_uuid, 0):]]
            self._settled[atom_uuid] = len(tried)
        if fresh and fresh[-1]["outcome"] is None:
            fresh[-1]["outcome"] = outcome
        return fresh
