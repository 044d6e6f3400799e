"""Conductor job spans: a child of the poster's span first, linked to that run when resumed."""

from __future__ import annotations

import types

import tracing_tasks as tt
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_tracing_engines import by_name, only, parent_of

from flowengine import engines, tracing
from flowengine.flows import linear_flow as lf
from flowengine.persistence.backends import impl_memory
from flowengine.tracing import names
from flowengine.utils import persistence_utils as pu


def test_a_resumed_job_links_to_the_run_that_started_its_flow(
    spans: InMemorySpanExporter,
) -> None:
    backend = impl_memory.MemoryBackend()
    _book, detail = pu.temporary_flow_detail(backend)
    with trace.get_tracer("service").start_as_current_span("post") as posting:
        job = types.SimpleNamespace(name="provision", uuid="job-1",
                                    details={tracing.TRACE_KEY: tracing.job_trace()})
    flow = lf.Flow("provision").add(tt.Note("a", inject={"value": 1}))

    first = engines.load(flow, flow_detail=detail, backend=backend)
    with tracing.claimed_job(job, "conductor-1", first.storage):
        first.run()
    stored = dict(first.storage.flow_meta[tracing.TRACE_KEY])
    second = engines.load(flow, flow_detail=detail, backend=backend)
    with tracing.claimed_job(job, "conductor-2", second.storage):
        second.run()

    found = by_name(spans)
    claimed, resumed = found["job provision"]
    assert parent_of(claimed) == posting.get_span_context().span_id
    assert claimed.attributes[names.CONDUCTOR] == "conductor-1"
    assert claimed.attributes[names.RESUMED] is False
    assert stored["traceparent"].split("-")[2] == format(claimed.context.span_id, "016x")
    assert resumed.attributes[names.RESUMED] is True
    assert resumed.attributes[names.CONDUCTOR] == "conductor-2"
    assert [link.context.span_id for link in resumed.links] == [claimed.context.span_id]
    first_flow, second_flow = found[f"flow {detail.name}"]
    assert parent_of(first_flow) == claimed.context.span_id
    assert parent_of(second_flow) == resumed.context.span_id
    # The stored context is the first run's, whoever resumes later.
    assert second.storage.flow_meta[tracing.TRACE_KEY] == stored


def test_a_job_posted_without_a_trace_gets_a_root_span(spans: InMemorySpanExporter) -> None:
    job = types.SimpleNamespace(name="plain", uuid="job-2", details={})
    with tracing.claimed_job(job, "conductor-1"):
        pass
    assert only(by_name(spans), "job plain").parent is None
