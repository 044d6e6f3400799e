"""Worker-based spans: ``send <task>`` per request attempt, ``run <task>`` on the worker.

The engine side calls :func:`request_sent` where it builds an attempt's headers: the producer
span is a child of the atom's ``execute``/``revert`` span, its context travels as the
``traceparent``/``tracestate`` headers, and it lasts until the attempt's outcome. An attempt
that is replaced (its lease lapsed, or it was handed back) ends as ``lost``, and its
replacement's span links to it. The worker wraps each request in :func:`serving`: a consumer
span that is the producer span's child, current while the task runs, whose outcome
:func:`replied` records.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from flowengine.tracing import _api, names
from flowengine.tracing import propagation as prop
from flowengine.tracing._registry import REGISTRY

_NOTHING = contextlib.nullcontext()
#: The consumer span of the request this thread serves.
_serving: contextvars.ContextVar[_Served | None] = contextvars.ContextVar("flowengine_serving",
                                                              default=None)
#: Replies that are not the request's outcome.
_NOT_OUTCOMES = frozenset(("RUNNING", "PENDING", "WAITING"))
_FAILED = frozenset(("FAILURE",))


def request_sent(headers: MutableMapping[str, Any], atom_uuid: str, *, request_id: str,
                 attempt: int, task_name: str, topic: str) -> None:
    """Open the producer span of a request attempt and add its context to ``headers``.

    Nothing happens unless the atom's span is open in this process (tracing on). The worker is
    not named here: workers on a topic share its queue, so the one that takes the request is
    known only from its ``run`` span.
    """
    entry = REGISTRY.by_uuid.get(atom_uuid)
    if entry is None:
        return
    attributes = names.clean({
        names.TASK_NAME: task_name, names.ATOM_UUID: atom_uuid, names.MESSAGE_ID: request_id,
        names.REQUEST_ATTEMPT: attempt, names.DESTINATION: topic, names.OPERATION: "send"})
    entry.send(headers, attributes, task_name)


def serving(headers: Mapping[str, Any] | None, *, task_name: Any, worker: str,
            request_id: Any = None, attempt: Any = None,
            topic: str | None = None) -> contextlib.AbstractContextManager[Any]:
    """A consumer span around a worker serving one request (nothing when tracing is off)."""
    tracer = _api.tracer()
    if tracer is None:
        return _NOTHING
    return _consume(tracer, headers or {}, task_name, worker, request_id, attempt, topic)


@contextlib.contextmanager
def _consume(tracer: Any, headers: Mapping[str, Any], task_name: Any, worker: str,
             request_id: Any, attempt: Any, topic: str | None) -> Iterator[None]:
    trace = _api.otel()[0]
    name = str(task_name)[:200]  # from the message: bounded
    sent_at = headers.get(prop.SENT_AT)
    queued = None
    if isinstance(sent_at, (int, float)) and not isinstance(sent_at, bool):
        queued = max(time.time() - float(sent_at), 0.0)
    attributes = names.clean({
        names.TASK_NAME: name, names.WORKER: worker, names.QUEUE_TIME: queued,
        names.MESSAGE_ID: request_id if isinstance(request_id, str) else None,
        names.REQUEST_ATTEMPT: attempt if isinstance(attempt, int) else None,
        names.DESTINATION: topic, names.OPERATION: "process"})
    span = tracer.start_span(names.RUN.format(name), context=prop.extract(headers),
                             kind=trace.SpanKind.CONSUMER, attributes=attributes)
    served = _Served(span)
    token = _serving.set(served)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=True,
                            set_status_on_exception=True):
            yield
    finally:
        _serving.reset(token)
        if served.outcome in _FAILED:
            span.set_status(trace.Status(trace.StatusCode.ERROR, served.outcome))
        span.end()


def replied(state: str, event_type: Any = None) -> None:
    """Record the reply a worker sends as the outcome of the request it serves."""
    served = _serving.get()
    if served is None or state in _NOT_OUTCOMES:
        return
    served.outcome = str(event_type) if state == "EVENT" and event_type else state
    served.span.set_attribute(names.OUTCOME, served.outcome)


class _Served:
    __slots__ = ("outcome", "span")

    def __init__(self, span: Any) -> None:
        self.span, self.outcome = span, ""
