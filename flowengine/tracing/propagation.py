"""W3C trace context in message headers and stored records: ``traceparent`` and ``tracestate``.

The W3C format is used whatever propagator the application configured globally, because the
headers are part of flowengine's wire format: a worker must read what any engine wrote. TaskFlow
peers ignore headers they do not know, and nothing ever goes into a message body.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from flowengine.tracing._api import otel

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: Request header: UNIX time the attempt was published (for the worker's queue time).
SENT_AT = "x-flowengine-sent-at"

_propagator: Any = None


def _w3c() -> Any:
    global _propagator
    if _propagator is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _propagator = TraceContextTextMapPropagator()
    return _propagator


def inject(carrier: MutableMapping[str, Any], span: Any) -> None:
    """Write ``span``'s context into ``carrier`` as ``traceparent`` (and ``tracestate``)."""
    _w3c().inject(carrier, context=otel()[0].set_span_in_context(span))


def carrier_of(span: Any) -> dict[str, str]:
    """``span``'s context as a JSON-able dict (for job details or flow metadata)."""
    carrier: dict[str, str] = {}
    inject(carrier, span)
    return carrier


def extract(carrier: Mapping[str, Any] | None) -> Any | None:
    """The context a carrier names, or None when it holds no valid ``traceparent``.

    Header values from the wire are untrusted: anything but short strings is ignored.
    """
    if not carrier:
        return None
    parent = carrier.get(TRACEPARENT)
    if not isinstance(parent, str) or len(parent) > 128:
        return None
    fields = {TRACEPARENT: parent}
    state = carrier.get(TRACESTATE)
    if isinstance(state, str) and len(state) <= 512:
        fields[TRACESTATE] = state
    context = _w3c().extract(fields)
    if not otel()[0].get_current_span(context).get_span_context().is_valid:
        return None
    return context


def span_context(carrier: Mapping[str, Any] | None) -> Any | None:
    """The span context a carrier names (for a link), or None."""
    context = extract(carrier)
    if context is None:
        return None
    return otel()[0].get_current_span(context).get_span_context()
