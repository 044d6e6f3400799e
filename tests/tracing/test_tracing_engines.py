"""Engine spans with the SDK's in-memory exporter: serial and parallel engines, in-process."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
import tracing_tasks as tt
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flowengine import engines, tracing
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.tracing import names

LOCAL_ENGINES = ["serial", "parallel"]


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def only(found: dict[str, list[ReadableSpan]], name: str) -> ReadableSpan:
    [span] = found[name]
    return span


@pytest.mark.parametrize("kind", LOCAL_ENGINES)
def test_a_flow_span_is_the_child_of_the_callers_span_and_the_parent_of_each_atom(
    spans: InMemorySpanExporter, kind: str,
) -> None:  # fmt: skip
    flow = uf.Flow("orders").add(tt.Note("a", inject={"value": 1}),
                                 tt.Note("b", inject={"value": 2}))
    engine = engines.load(flow, engine=kind)
    with trace.get_tracer("service").start_as_current_span("request") as request:
        engine.run()
    found = by_name(spans)
    flow_span = only(found, "flow orders")
    assert parent_of(flow_span) == request.get_span_context().span_id
    assert flow_span.attributes == {
        names.FLOW_NAME: "orders", names.FLOW_UUID: engine.storage.flow_uuid,
        names.ENGINE: kind, names.OUTCOME: "SUCCESS"}
    for atom in ("a", "b"):
        span = only(found, f"execute {atom}")
        assert parent_of(span) == flow_span.context.span_id
        assert span.context.trace_id == request.get_span_context().trace_id
        assert span.attributes[names.OUTCOME] == "SUCCESS"
        assert span.attributes[names.ATOM_ATTEMPT] == 1
        assert span.attributes[names.ATOM_UUID] == engine.storage.get_atom_uuid(atom)


def test_without_a_callers_span_the_flow_span_is_a_root(spans: InMemorySpanExporter) -> None:
    engines.run(lf.Flow("alone").add(tt.Note("a", inject={"value": 1})))
    assert only(by_name(spans), "flow alone").parent is None


@pytest.mark.parametrize("kind", LOCAL_ENGINES)
def test_log_records_inside_a_task_carry_its_trace_and_span_ids(
    spans: InMemorySpanExporter, kind: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.handler.addFilter(tracing.TraceContextFilter())
    caplog.set_level(logging.INFO, logger="tracing_tasks")
    flow = uf.Flow("logged").add(*(tt.Note(f"n{i}", inject={"value": i}) for i in range(3)))
    engines.run(flow, engine=kind)
    found = by_name(spans)
    records = [r for r in caplog.records if r.name == "tracing_tasks"]
    assert len(records) == 3
    for record in records:
        atom = record.getMessage().split()[-1]
        span = only(found, f"execute {atom}")
        assert record.otelSpanID == format(span.context.span_id, "016x")
        assert record.otelTraceID == format(span.context.trace_id, "032x")
    # After the run, nothing is current any more.
    logging.getLogger("tracing_tasks").info("after")
    assert caplog.records[-1].otelSpanID == "0" * 16


def test_a_task_failure_is_recorded_masked_and_its_revert_is_a_sibling_span(
    spans: InMemorySpanExporter,
) -> None:
    flow = lf.Flow("failing").add(tt.Note("first", inject={"value": 1}),
                                  tt.Fail("login", inject={"password": "hunter2"}))
    with pytest.raises(Exception, match="cannot log in with"):  # a redacted failure is wrapped
        engines.run(flow)
    found = by_name(spans)
    flow_span = only(found, "flow failing")
    assert flow_span.attributes[names.OUTCOME] == "REVERTED"
    assert flow_span.status.status_code == trace.StatusCode.ERROR
    failed = only(found, "execute login")
    assert failed.attributes[names.OUTCOME] == "FAILURE"
    assert failed.attributes[names.RETRY_DECISION] == "REVERT_ALL"
    assert "hunter2" not in str(failed.status.description)
    assert "cannot log in with" in str(failed.status.description)
    [event] = failed.events
    assert event.attributes is not None and "hunter2" not in str(event.attributes)
    reverts = [only(found, "revert first"), only(found, "revert login")]
    assert {parent_of(s) for s in reverts} == {flow_span.context.span_id}
    assert [s.attributes[names.OUTCOME] for s in reverts] == ["REVERTED", "REVERTED"]


def test_a_url_password_in_a_failure_never_reaches_its_span(
    spans: InMemorySpanExporter,
) -> None:
    # doc/tracing.rst: the exception event carries the message with URL passwords masked.
    url = "amqp://svc:pa55-in-url@mq.example:5672//"
    flow = lf.Flow("unreachable").add(tt.FailReaching("connect", inject={"url": url}))
    with pytest.raises(ConnectionError):
        engines.run(flow)
    failed = only(by_name(spans), "execute connect")
    [event] = failed.events
    assert event.attributes is not None
    assert event.attributes["exception.message"] == (
        "cannot reach amqp://svc:***@mq.example:5672//"), event.attributes
    assert "pa55-in-url" not in str(failed.status.description)


def test_a_retried_atom_has_one_span_per_attempt_with_the_decision(
    spans: InMemorySpanExporter,
) -> None:
    tt.FailOnce.failed.discard("flaky")
    flow = lf.Flow("retried", retry=tt.retry_twice("twice")).add(tt.FailOnce("flaky"))
    engines.run(flow)
    found = by_name(spans)
    first, second = sorted(found["execute flaky"], key=lambda s: s.start_time or 0)
    assert (first.attributes[names.ATOM_ATTEMPT], second.attributes[names.ATOM_ATTEMPT]) == (1, 2)
    assert first.attributes[names.OUTCOME] == "FAILURE"
    assert first.attributes[names.RETRY_DECISION] == "RETRY"
    assert first.attributes[names.RETRY_NAME] == "twice"
    assert second.attributes[names.OUTCOME] == "SUCCESS"
    assert names.RETRY_DECISION not in second.attributes
    assert [s.attributes[names.ATOM_KIND] for s in found["execute twice"]] == ["retry", "retry"]
    assert only(found, "revert flaky").attributes[names.OUTCOME] == "REVERTED"
    assert only(found, "flow retried").attributes[names.OUTCOME] == "SUCCESS"


def test_a_suspended_run_ends_its_flow_span_as_suspended(spans: InMemorySpanExporter) -> None:
    flow = lf.Flow("paused").add(tt.Note("a", inject={"value": 1}),
                                 tt.Note("b", inject={"value": 2}))
    engine = engines.load(flow)

    def suspend_after_a(state: str, details: dict[str, Any]) -> None:
        if details["task_name"] == "a":
            engine.suspend()

    engine.atom_notifier.register("SUCCESS", suspend_after_a)
    engine.run()
    engine.atom_notifier.deregister("SUCCESS", suspend_after_a)
    found = by_name(spans)
    assert only(found, "flow paused").attributes[names.OUTCOME] == "SUSPENDED"
    engine.run()
    assert [s.attributes[names.OUTCOME] for s in by_name(spans)["flow paused"]] == [
        "SUSPENDED", "SUCCESS"]


def test_with_no_provider_nothing_is_recorded_and_the_hooks_do_nothing() -> None:
    assert not tracing.enabled()
    assert isinstance(tracing.flow_run(engines.load(tt.Note("x", inject={"value": 1}))),
                      type(tracing.task_scope(object())))
    headers: dict[str, Any] = {}
    tracing.request_sent(headers, "no-such-atom", request_id="r", attempt=1, task_name="t",
                         topic="q")
    assert headers == {}
    with tracing.serving({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
                         task_name="t", worker="w"):
        tracing.replied("SUCCESS")
    assert tracing.job_trace() == {}


def test_the_log_filter_names_the_extra_when_the_api_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)  # import fails
    with pytest.raises(ImportError, match=r"flowengine\[otel\]"):
        tracing.TraceContextFilter()
    assert not tracing.enabled()


@pytest.mark.parametrize("kind", LOCAL_ENGINES)
def test_the_context_logger_carries_the_atoms_trace_ids(
    spans: InMemorySpanExporter, kind: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from flowengine import context

    engine = engines.load(lf.Flow("logged").add(tt.ContextNote("noted")), engine=kind)
    with caplog.at_level(logging.INFO, logger=context.TASK_LOGGER):
        engine.run()
    [record] = [r for r in caplog.records if r.name == context.TASK_LOGGER]
    span = only(by_name(spans), "execute noted")
    assert record.otelTraceID == format(span.context.trace_id, "032x")  # type: ignore[attr-defined]
    assert record.otelSpanID == format(span.context.span_id, "016x")  # type: ignore[attr-defined]
    assert record.atom_name == "noted"  # type: ignore[attr-defined]
    assert record.flow_uuid == engine.storage.flow_uuid  # type: ignore[attr-defined]
