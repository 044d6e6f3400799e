"""Tracing with OpenTelemetry: one trace from a service's request to every remote task.

On when the OpenTelemetry API is imported and a tracer provider is configured (the ``otel``
extra installs the API; the SDK and exporters are the application's choice), free otherwise.
See ``doc/tracing.rst`` for the spans, their attributes and the setup with a collector.

The public names are for applications (the logging filter), services posting jobs and
conductors. Engines trace through :class:`TracingHook`, one of the process's default engine
hooks (see :mod:`flowengine.hooks`); the worker-based executor and the worker call the
functions below.
"""

from flowengine.tracing._api import enabled, flush
from flowengine.tracing.jobs import TRACE_KEY, claimed_job, job_trace
from flowengine.tracing.logs import TraceContextFilter, current_ids
from flowengine.tracing.propagation import SENT_AT, TRACEPARENT, TRACESTATE
from flowengine.tracing.remote import replied, request_sent, serving
from flowengine.tracing.runs import TracingHook, failure_resolved, flow_run, task_scope

__all__ = [
    # applications
    "enabled",
    "flush",
    "TraceContextFilter",
    "current_ids",
    # jobs and conductors
    "TRACE_KEY",
    "claimed_job",
    "job_trace",
    # the wire
    "SENT_AT",
    "TRACEPARENT",
    "TRACESTATE",
    # the engines' hook, and what the workers call
    "TracingHook",
    "failure_resolved",
    "flow_run",
    "replied",
    "request_sent",
    "serving",
    "task_scope",
]
