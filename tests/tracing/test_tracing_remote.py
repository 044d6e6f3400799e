"""Worker-based spans in-process, over kombu's memory transport: a real worker, and a scripted
one that hands an attempt back so that it is replaced."""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import tracing_tasks as tt
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_tracing_engines import by_name, only, parent_of

from flowengine import engines, tracing
from flowengine.flows import linear_flow as lf
from flowengine.tracing import names
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.executor import WorkerTaskExecutor
from flowengine.worker_based.worker import Worker

WAIT = 20.0
TOPIC = "traced"


@pytest.fixture
def exchange() -> str:
    return f"tracing-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def worker(exchange: str) -> Iterator[Worker]:
    serving = Worker(exchange, TOPIC, tasks=[tt.__name__], threads_count=2, transport="memory")
    thread = threading.Thread(target=serving.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    assert serving.wait(WAIT)
    yield serving
    serving.stop(grace=1)
    thread.join(WAIT)


def test_the_worker_span_is_the_child_of_the_attempt_sent_from_the_atoms_span(
    spans: InMemorySpanExporter, exchange: str, worker: Worker,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.handler.addFilter(tracing.TraceContextFilter())
    caplog.set_level(logging.INFO, logger="tracing_tasks")
    flow = lf.Flow("remote").add(tt.Note("one", inject={"value": 1}),
                                 tt.Note("two", inject={"value": 2}))
    engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                          transport="memory")
    with trace.get_tracer("service").start_as_current_span("request") as request:
        engine.run()
    found = by_name(spans)
    flow_span = only(found, "flow remote")
    assert flow_span.attributes[names.ENGINE] == "worker-based"
    assert parent_of(flow_span) == request.get_span_context().span_id
    trace_id = request.get_span_context().trace_id
    records = {r.getMessage().split()[-1]: r for r in caplog.records if r.name == "tracing_tasks"}
    for atom in ("one", "two"):
        execute = only(found, f"execute {atom}")
        sent = only(found, f"send {atom}")
        ran = only(found, f"run {atom}")
        assert parent_of(execute) == flow_span.context.span_id
        assert parent_of(sent) == execute.context.span_id
        assert parent_of(ran) == sent.context.span_id
        assert {s.context.trace_id for s in (execute, sent, ran)} == {trace_id}
        assert sent.kind == trace.SpanKind.PRODUCER and ran.kind == trace.SpanKind.CONSUMER
        assert sent.attributes[names.REQUEST_ATTEMPT] == 1
        assert sent.attributes[names.OUTCOME] == "SUCCESS"
        assert sent.attributes[names.DESTINATION] == TOPIC
        assert ran.attributes[names.WORKER] == worker.worker_id
        assert ran.attributes[names.OUTCOME] == "SUCCESS"
        assert ran.attributes[names.MESSAGE_ID] == sent.attributes[names.MESSAGE_ID]
        assert 0 <= ran.attributes[names.QUEUE_TIME] < WAIT
        assert records[atom].otelSpanID == format(ran.context.span_id, "016x")


def test_a_worker_traces_through_its_hooks_and_without_them_serves_untraced(
        spans: InMemorySpanExporter, exchange: str) -> None:
    untraced = Worker(exchange, TOPIC, tasks=[tt.__name__], threads_count=1,
                      transport="memory", hooks=[])
    thread = threading.Thread(target=untraced.run, kwargs={"display_banner": False},
                              daemon=True)
    thread.start()
    assert untraced.wait(WAIT)
    try:
        flow = lf.Flow("remote").add(tt.Note("one", inject={"value": 1}))
        engines.run(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                    transport="memory")
    finally:
        untraced.stop(grace=1)
        thread.join(WAIT)
    found = by_name(spans)
    assert only(found, "send one").attributes[names.OUTCOME] == "SUCCESS"  # the engine's
    assert "run one" not in found


class HandingBack:
    """A worker that hands its first request back unrun (as one whose broker redelivered it
    does) and runs the next attempt."""

    def __init__(self, exchange: str) -> None:
        self.headers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._handed_back = False
        handlers = {pr.REQUEST: dp.Handler(self._on_request),
                    pr.NOTIFY: dp.Handler(self._on_notify)}
        self.proxy = px.Proxy(TOPIC, exchange, handlers, transport="memory")
        self._own = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION, pr.HEADER_WORKER: "scripted"}

    def _on_notify(self, data: Any, message: Any) -> None:
        self.proxy.publish(pr.Notify(topic=TOPIC, tasks=[pr.task_class_name(tt.Note)]),
                           message.properties["reply_to"], headers=self._own)

    def _reply(self, message: Any, state: str, **data: Any) -> None:
        self.proxy.publish(pr.Response(state, **data), message.properties["reply_to"],
                           correlation_id=message.properties["correlation_id"],
                           headers=self._own)

    def _on_request(self, data: Any, message: Any) -> None:
        self.headers.put(dict(message.headers))
        if not self._handed_back:
            self._handed_back = True
            self._reply(message, pr.EVENT, event_type=ext.EVENT_REDELIVERED, details={})
            return
        self._reply(message, pr.RUNNING)
        self._reply(message, pr.SUCCESS, result=data["arguments"]["value"] + 1)


def test_a_replaced_attempt_ends_lost_and_its_replacement_links_to_it(
    spans: InMemorySpanExporter, exchange: str,
) -> None:  # fmt: skip
    scripted = HandingBack(exchange)
    thread = threading.Thread(target=scripted.proxy.start, daemon=True)
    thread.start()
    assert scripted.proxy.wait(WAIT)
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, [TOPIC], transport="memory")
    try:
        engine = engines.load(tt.Note("only", inject={"value": 1}), engine="worker-based",
                              executor=executor)
        engine.run()
    finally:
        executor.stop()
        scripted.proxy.stop()
        thread.join(WAIT)
    assert engine.storage.get("only") == 2
    found = by_name(spans)
    execute = only(found, "execute only")
    lost, kept = sorted(found["send only"], key=lambda s: s.attributes[names.REQUEST_ATTEMPT])
    assert (lost.attributes[names.REQUEST_ATTEMPT], kept.attributes[names.REQUEST_ATTEMPT]) == (
        1, 2)
    assert {parent_of(lost), parent_of(kept)} == {execute.context.span_id}
    assert lost.attributes[names.OUTCOME] == "lost"
    assert kept.attributes[names.OUTCOME] == "SUCCESS"
    assert [link.context.span_id for link in kept.links] == [lost.context.span_id]
    first, second = scripted.headers.get(timeout=WAIT), scripted.headers.get(timeout=WAIT)
    # Each attempt's own context travelled in its headers.
    assert first[tracing.TRACEPARENT].split("-")[2] == format(lost.context.span_id, "016x")
    assert second[tracing.TRACEPARENT].split("-")[2] == format(kept.context.span_id, "016x")


@pytest.mark.parametrize("traceparent", [
    "00-zz-not-hex", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "x" * 1000, 42, None])
def test_a_worker_given_an_unusable_traceparent_starts_a_trace_of_its_own(
    spans: InMemorySpanExporter, traceparent: object,
) -> None:  # fmt: skip
    headers = {tracing.TRACEPARENT: traceparent, tracing.TRACESTATE: "k=" + "v" * 1000,
               tracing.SENT_AT: "yesterday"}
    with tracing.serving(headers, task_name="t" * 500, worker="w", attempt="2"):
        tracing.replied("FAILURE")
    [ran] = spans.get_finished_spans()
    assert ran.parent is None
    assert ran.name == "run " + "t" * 200  # names from a message are bounded
    assert names.QUEUE_TIME not in ran.attributes and names.REQUEST_ATTEMPT not in ran.attributes
    assert ran.attributes[names.OUTCOME] == "FAILURE"
    assert ran.status.status_code == trace.StatusCode.ERROR
