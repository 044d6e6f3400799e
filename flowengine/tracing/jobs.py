"""Conductor spans: ``job <name>`` per claimed job, tied to the flow's trace across conductors.

A service that posts a job stores its current trace context in the job's details with
:func:`job_trace`; a conductor wraps each claimed job's run in :func:`claimed_job`. The first
run of the job's flow is a child of the poster's span and stores its own context in the flow
detail's metadata; a later run (the job resumed by another conductor after the first one died)
links to that stored context, so the two runs are found from each other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from flowengine.tracing import _api, names
from flowengine.tracing import propagation as prop

if TYPE_CHECKING:
    from flowengine.engines.repair import ListedJob
    from flowengine.storage import Storage

LOG = logging.getLogger(__name__)

#: Key of the trace context in a job's details and in a flow detail's metadata.
TRACE_KEY = "trace"


def job_trace() -> dict[str, str]:
    """The current trace context as a JSON-able dict (empty when tracing is off).

    Store it in a job's details under :data:`TRACE_KEY` when posting, so the conductor's span
    joins the poster's trace: ``board.post(name, book, details={TRACE_KEY: job_trace()})``.
    """
    if _api.tracer() is None:
        return {}
    span = _api.otel()[0].get_current_span()
    return prop.carrier_of(span) if span.get_span_context().is_valid else {}


def _carrier(mapping: object) -> Mapping[str, Any] | None:
    value = mapping.get(TRACE_KEY) if isinstance(mapping, Mapping) else None
    return value if isinstance(value, Mapping) else None


@contextlib.contextmanager
def claimed_job(job: ListedJob, conductor: str,
                storage: Storage | None = None) -> Iterator[None]:
    """A span for a conductor running one claimed job, current while the flow runs.

    Args:
        job: The claimed job (its ``name``, ``uuid`` and ``details`` are read).
        conductor: The conductor's name.
        storage: The job's flow :class:`~flowengine.storage.Storage`, whose metadata holds the
            flow's trace context: read to link a resumed run, written on the first run.
    """
    tracer = _api.tracer()
    if tracer is None:
        yield
        return
    trace = _api.otel()[0]
    stored = _carrier(storage.flow_meta) if storage is not None else None
    earlier = prop.span_context(stored)
    links = [trace.Link(earlier, {names.RESUMED: True})] if earlier is not None else []
    name = str(getattr(job, "name", "?"))
    attributes = names.clean({
        names.JOB_NAME: name, names.JOB_UUID: getattr(job, "uuid", None),
        names.CONDUCTOR: conductor, names.RESUMED: earlier is not None,
        names.FLOW_UUID: storage.flow_uuid if storage is not None else None})
    span = tracer.start_span(names.JOB.format(name), kind=trace.SpanKind.CONSUMER,
                             context=prop.extract(_carrier(getattr(job, "details", None))),
                             attributes=attributes, links=links)
    if storage is not None and stored is None:
        try:
            storage.update_flow_metadata({TRACE_KEY: prop.carrier_of(span)})
        except Exception:  # the run matters more than its trace
            LOG.warning("Could not store the trace context of job %r", name, exc_info=True)
    with trace.use_span(span, end_on_exit=True, record_exception=True,
                        set_status_on_exception=True):
        yield
