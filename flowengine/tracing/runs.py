"""Engine spans: ``flow <name>`` per run, ``execute <atom>`` / ``revert <atom>`` per atom.

:class:`FlowTrace` is a listener the engine enters around its run loop; it opens and ends spans
on the engine's own notifications, so the engine only calls :func:`flow_run`. A task's span is
made current in the thread that runs the task (:func:`task_scope`), where log records and the
task's own spans pick it up. A failed execution's span stays open until the failure is resolved
(:func:`failure_resolved`), so it carries the retry controller's decision.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from flowengine import hooks, states
from flowengine.listeners import base
from flowengine.listeners.atoms import redacted_failure
from flowengine.persistence.backends._uri import mask_urls
from flowengine.tracing import _api, names, remote
from flowengine.tracing._registry import REGISTRY, AtomSpan
from flowengine.types.failure import Failure
from flowengine.types.notifier import Notifier

if TYPE_CHECKING:
    from flowengine.atom import Atom
    from flowengine.engines.engine import ActionEngine

_NOTHING = contextlib.nullcontext()
#: Flow states that end a run.
FLOW_END_STATES = frozenset((states.SUCCESS, states.REVERTED, states.FAILURE, states.SUSPENDED))
#: Outcome of a flow span whose run stopped without reaching an end state.
INCOMPLETE = "INCOMPLETE"
_ACTIONS = {states.RUNNING: names.EXECUTE, states.REVERTING: names.REVERT}
_ATOM_END_STATES = frozenset(base.FINISH_STATES)
_ERROR_STATES = frozenset((states.FAILURE, states.REVERTED, states.REVERT_FAILURE))


def flow_run(engine: ActionEngine) -> contextlib.AbstractContextManager[Any]:
    """What the engine enters around its run: a :class:`FlowTrace`, or nothing when off."""
    tracer = _api.tracer()
    if tracer is None:
        return _NOTHING
    return FlowTrace(engine, tracer)


class _Current:
    """Makes an atom's span the current one (a class: cheaper than a generator per task)."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Any) -> None:
        self._span, self._token = span, None

    def __enter__(self) -> None:
        trace, context = _api.otel()
        self._token = context.attach(trace.set_span_in_context(self._span))

    def __exit__(self, *exc_info: object) -> None:
        _api.otel()[1].detach(self._token)


def task_scope(task: Atom) -> contextlib.AbstractContextManager[Any]:
    """Make ``task``'s open span current while it runs here (nothing when none is open)."""
    if not REGISTRY.by_uuid:
        return _NOTHING
    entry = REGISTRY.of_atom(task)
    return _NOTHING if entry is None else _Current(entry.span)


def failure_resolved(atom_uuid: str, decision: object, retry: Atom | None) -> None:
    """Record how an atom's failure was resolved on its span, and end the span."""
    entry = REGISTRY.by_uuid.get(atom_uuid)
    if entry is None or entry.ended_at is None:
        return
    entry.span.set_attribute(names.RETRY_DECISION, str(decision))
    if retry is not None:
        entry.span.set_attribute(names.RETRY_NAME, str(retry.name))
    _finish(entry)


def _finish(entry: AtomSpan) -> None:
    REGISTRY.remove(entry)
    entry.span.end(end_time=entry.ended_at)


class FlowTrace(base.Listener):
    """Spans of one engine run (see the module docstring).

    Args:
        engine: The engine about to run.
        tracer: The OpenTelemetry tracer to use.
    """

    def __init__(self, engine: ActionEngine, tracer: Any) -> None:
        super().__init__(engine, flow_listen_for=())
        self._tracer = tracer
        self._lock = threading.Lock()
        self._span: Any = None
        self._parent: Any = None
        self._inside = False
        self._outcome: str | None = None
        self._open: dict[str, AtomSpan] = {}
        self._failed: list[AtomSpan] = []  # ended, awaiting failure_resolved
        self._runs: dict[tuple[str, str], int] = {}
        self._atoms: dict[str, Atom] = {}

    def __enter__(self) -> FlowTrace:
        trace = _api.otel()[0]
        engine, storage = self._engine, self._engine.storage
        self._atoms = {atom.name: atom for atom in engine.compilation.iter_atoms()}
        self._span = self._tracer.start_span(
            names.FLOW.format(storage.flow_name), kind=trace.SpanKind.INTERNAL,
            attributes=names.clean({names.FLOW_NAME: storage.flow_name,
                                    names.FLOW_UUID: storage.flow_uuid,
                                    names.ENGINE: names.engine_kind(engine)}))
        self._parent = trace.set_span_in_context(self._span)
        self._inside = True
        # Registered for as long as the span is open: the engine announces the run's end state
        # just after leaving the run loop (and this context).
        engine.notifier.register(Notifier.ANY, self._on_flow)
        super().__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc_value: BaseException | None,
                 tb: TracebackType | None) -> None:
        super().__exit__(exc_type, exc_value, tb)
        self._flush_failed()
        with self._lock:
            self._inside = False
            outcome = self._outcome
        if exc_value is not None:
            if self._span is not None:
                self._span.record_exception(exc_value)
            self._end(outcome or states.FAILURE, _describe(exc_value))
        elif outcome is not None:
            self._end(outcome, None)

    # -- the flow --------------------------------------------------------------------------------

    def _on_flow(self, state: str, details: dict[str, Any]) -> None:
        with self._lock:
            inside = self._inside
            if inside and state in FLOW_END_STATES:
                self._outcome = state
        if not inside:
            self._end(state if state in FLOW_END_STATES else INCOMPLETE, None)

    def _end(self, outcome: str, error: str | None) -> None:
        trace = _api.otel()[0]
        with self._lock:
            span, self._span = self._span, None
            leftover, self._open = list(self._open.values()), {}
        if span is None:
            return
        self._engine.notifier.deregister(Notifier.ANY, self._on_flow)
        for entry in leftover:  # atoms still running when the run stopped (suspension, crash)
            self._end_atom(entry, INCOMPLETE, None)
        span.set_attribute(names.OUTCOME, outcome)
        if outcome in _ERROR_STATES:
            span.set_status(trace.Status(trace.StatusCode.ERROR, error or outcome))
        span.end()

    # -- atoms -----------------------------------------------------------------------------------

    def _task_receiver(self, state: str, details: base.Details) -> None:
        self._atom(state, details, details["task_name"], details["task_uuid"], "task")

    def _retry_receiver(self, state: str, details: base.Details) -> None:
        self._atom(state, details, details["retry_name"], details["retry_uuid"], "retry")

    def _atom(self, state: str, details: base.Details, name: str, uuid: str, kind: str) -> None:
        self._flush_failed()
        action = _ACTIONS.get(state)
        if action is not None:
            self._start_atom(action, name, uuid, kind)
            return
        if state not in _ATOM_END_STATES:
            return
        with self._lock:
            entry = self._open.pop(uuid, None)
        if entry is None:
            return
        result = details.get("result")
        failure = redacted_failure(self._engine, name, result) if isinstance(
            result, Failure) else None
        if state == states.FAILURE and kind == "task":
            # Kept open until the engine decides what the failure means (failure_resolved).
            self._describe_atom(entry, state, failure)
            entry.ended_at = time.time_ns()
            self._failed.append(entry)
            return
        self._end_atom(entry, state, failure)

    def _start_atom(self, action: str, name: str, uuid: str, kind: str) -> None:
        trace = _api.otel()[0]
        with self._lock:
            key = (uuid, action)
            attempt = self._runs[key] = self._runs.get(key, 0) + 1
            parent = self._parent
        if parent is None:
            return
        span = self._tracer.start_span(
            action.format(name), context=parent, kind=trace.SpanKind.INTERNAL,
            attributes={names.ATOM_NAME: name, names.ATOM_UUID: uuid, names.ATOM_KIND: kind,
                        names.ATOM_ATTEMPT: attempt})
        entry = AtomSpan(self._tracer, span, self._atoms.get(name), uuid)
        with self._lock:
            stale = self._open.pop(uuid, None)
            self._open[uuid] = entry
        if stale is not None:
            self._end_atom(stale, INCOMPLETE, None)
        REGISTRY.add(entry)

    def _describe_atom(self, entry: AtomSpan, state: str, failure: Failure | None) -> None:
        trace = _api.otel()[0]
        entry.end_attempt(state)
        entry.span.set_attribute(names.OUTCOME, state)
        if failure is not None:
            kind = failure.exc_type_names[0] if failure.exc_type_names else "Exception"
            message = mask_urls(failure.exception_str)
            entry.span.add_event("exception", {"exception.type": kind,
                                               "exception.message": message})
            entry.span.set_status(trace.Status(trace.StatusCode.ERROR, f"{kind}: {message}"))
        elif state in _ERROR_STATES:
            entry.span.set_status(trace.Status(trace.StatusCode.ERROR, state))

    def _end_atom(self, entry: AtomSpan, state: str, failure: Failure | None) -> None:
        self._describe_atom(entry, state, failure)
        entry.ended_at = time.time_ns()
        _finish(entry)

    def _flush_failed(self) -> None:
        # A failure nobody resolved (never_resolve, a revert's failure) ends at the next event.
        while self._failed:
            entry = self._failed.pop()
            if REGISTRY.by_uuid.get(entry.uuid) is entry:
                _finish(entry)


def _describe(error: BaseException) -> str:
    return mask_urls(f"{type(error).__name__}: {error}")


class TracingHook(hooks.Hook):
    """Traces engine runs: a span per run and atom, current while a task runs here, and how
    failures were resolved; a span per request attempt sent, and on workers a span per request
    served (one of the process's default hooks: see :mod:`flowengine.hooks`; free while
    tracing is off)."""

    def run(self, engine: ActionEngine) -> contextlib.AbstractContextManager[Any]:
        return flow_run(engine)

    def call(self, task: Atom) -> contextlib.AbstractContextManager[Any]:
        return task_scope(task)

    def failure_resolved(self, atom_uuid: str, decision: object, retry: Atom | None) -> None:
        failure_resolved(atom_uuid, decision, retry)

    def request_sent(self, headers: MutableMapping[str, Any], atom_uuid: str, *,
                     request_id: str, attempt: int, task_name: str, topic: str) -> None:
        remote.request_sent(headers, atom_uuid, request_id=request_id, attempt=attempt,
                            task_name=task_name, topic=topic)

    def serving(self, headers: Mapping[str, Any], *, task_name: str, worker: str,
                request_id: str | None, attempt: int | None,
                topic: str) -> contextlib.AbstractContextManager[Any]:
        return remote.serving(headers, task_name=task_name, worker=worker,
                              request_id=request_id, attempt=attempt, topic=topic)

    def replying(self, state: str, event_type: str | None) -> None:
        remote.replied(state, event_type)
