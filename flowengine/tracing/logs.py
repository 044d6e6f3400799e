"""A logging filter that stamps each record with the current trace and span ids."""

from __future__ import annotations

import logging

from flowengine.tracing import _api

#: Record attributes set by :class:`TraceContextFilter` (the names OpenTelemetry's own logging
#: instrumentation uses, so log formats written for it work unchanged).
TRACE_ID = "otelTraceID"
SPAN_ID = "otelSpanID"
SAMPLED = "otelTraceSampled"
_NO_TRACE, _NO_SPAN = "0" * 32, "0" * 16


class TraceContextFilter(logging.Filter):
    """Adds ``otelTraceID``, ``otelSpanID`` and ``otelTraceSampled`` to every record.

    Inside a traced atom (on the engine's threads or on a worker) they name the atom's or the
    worker's span; elsewhere they are zeros. Add it to a handler and use the fields in its
    format, for example ``%(otelTraceID)s %(otelSpanID)s %(message)s``.

    Raises:
        ImportError: when the OpenTelemetry API is not installed (the ``otel`` extra).
    """

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._trace = _api.require()

    def filter(self, record: logging.LogRecord) -> bool:
        context = self._trace.get_current_span().get_span_context()
        if context.is_valid:
            setattr(record, TRACE_ID, format(context.trace_id, "032x"))
            setattr(record, SPAN_ID, format(context.span_id, "016x"))
            setattr(record, SAMPLED, context.trace_flags.sampled)
        else:
            setattr(record, TRACE_ID, _NO_TRACE)
            setattr(record, SPAN_ID, _NO_SPAN)
            setattr(record, SAMPLED, False)
        return True


def current_ids() -> dict[str, str]:
    """``{otelTraceID, otelSpanID}`` of the current span, or nothing when tracing is off or no
    span is current (a task's context logger adds them to its records)."""
    trace = _api.trace_module()
    if trace is None or not _api.enabled():
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {TRACE_ID: format(context.trace_id, "032x"), SPAN_ID: format(context.span_id, "016x")}
