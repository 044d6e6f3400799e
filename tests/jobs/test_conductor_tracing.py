"""Conductors trace the jobs they run: one trace from the poster's span to the flow's atoms,
and a job resumed by another conductor links to the run that started it (on a Redis board;
the tracing itself does not depend on the backend)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs_flows
import pytest
from click.testing import CliRunner
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from span_capture import captured_spans
from test_conductor_behaviour import Events, make, running

from flowengine import tracing
from flowengine.cli.main import cli
from flowengine.jobs.base import JobBoard
from flowengine.jobs.posting import post_flow
from flowengine.persistence import backends as p_backends
from flowengine.persistence.backends import impl_memory
from flowengine.tracing import names

pytestmark = pytest.mark.parametrize("board_backend", ["redis"])


@pytest.fixture
def persistence() -> Iterator[impl_memory.MemoryBackend]:
    backend = impl_memory.MemoryBackend({})
    yield backend
    backend.close()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    yield from captured_spans(monkeypatch)


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in spans.get_finished_spans() if span.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_job_posted_inside_a_span_runs_in_the_posters_trace(
    board: JobBoard, persistence: Any, spans: InMemorySpanExporter,
) -> None:
    with trace.get_tracer("service").start_as_current_span("POST /orders") as request:
        job = post_flow(board, persistence, jobs_flows.steps, factory_args=(2,), name="order")
    assert job.details[tracing.TRACE_KEY]["traceparent"].split("-")[2] == format(
        request.get_span_context().span_id, "016x")
    conductor = make("blocking", board, persistence)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("job_consumed")

    [claimed] = named(spans, "job order")
    assert parent_id(claimed) == request.get_span_context().span_id
    assert claimed.attributes is not None
    assert claimed.attributes[names.CONDUCTOR] == "c1"
    assert claimed.attributes[names.JOB_UUID] == job.uuid
    assert claimed.attributes[names.RESUMED] is False
    [flow] = named(spans, "flow order")
    assert parent_id(flow) == claimed.context.span_id
    # Everything, down to the atoms, is in the request's one trace.
    assert {span.context.trace_id for span in spans.get_finished_spans()} == {
        request.get_span_context().trace_id}
    assert len(named(spans, "execute step-1")) == 1


def test_a_job_resumed_by_another_conductor_links_to_the_first_run(
    board: JobBoard, persistence: Any, spans: InMemorySpanExporter, tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    with trace.get_tracer("service").start_as_current_span("POST /orders"):
        post_flow(board, persistence, jobs_flows.steps, name="order",
                  store={"gate": str(gate), "gated_step": "step-2"})
    first = make("nonblocking", board, persistence, name="c1")
    handed_back = Events(first)
    thread = threading.Thread(target=first.run)
    thread.start()
    jobs_flows.wait_for_file(tmp_path / "gate.waiting")
    first.stop()  # suspends the engine: step-2 finishes, the job is handed back
    gate.touch()
    assert first.wait(20)
    thread.join()
    handed_back.wait_for("job_abandoned")
    second = make("blocking", board, persistence, name="c2")
    events = Events(second)
    with running(second):
        events.wait_for("job_consumed")

    started, resumed = sorted(named(spans, "job order"), key=lambda span: span.start_time or 0)
    assert started.attributes is not None and resumed.attributes is not None
    assert (started.attributes[names.CONDUCTOR], resumed.attributes[names.CONDUCTOR]) == (
        "c1", "c2")
    assert resumed.attributes[names.RESUMED] is True
    assert [link.context.span_id for link in resumed.links] == [started.context.span_id]
    assert resumed.context.trace_id == started.context.trace_id  # both continue the request
    # The resumed flow runs under the second job span.
    first_flow, second_flow = sorted(named(spans, "flow order"),
                                     key=lambda span: span.start_time or 0)
    assert parent_id(first_flow) == started.context.span_id
    assert parent_id(second_flow) == resumed.context.span_id


def test_a_job_posted_from_the_command_line_continues_its_traceparent(
    board: JobBoard, board_namespace: str, redis_url: str, spans: InMemorySpanExporter,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    monkeypatch.chdir(Path(jobs_flows.__file__).parent)
    monkeypatch.setenv("TRACEPARENT", f"00-{trace_id}-{span_id}-01")
    backend = f"sqlite:///{tmp_path / 'flows.db'}"
    post = ["jobs", "post", "--board", redis_url, "--board-option", f"namespace={board_namespace}",
            "--backend", backend, "jobs_flows:steps", "--arg", "1", "--name", "from-ci"]
    posted = CliRunner().invoke(cli, post, catch_exceptions=False)
    assert posted.exit_code == 0, posted.output
    refused = CliRunner().invoke(cli, [*post, "--traceparent", "not-a-trace"])
    assert refused.exit_code == 2 and "not a W3C traceparent" in refused.output
    with contextlib.closing(p_backends.fetch(backend)) as persistence:
        conductor = make("blocking", board, persistence)
        events = Events(conductor)
        with running(conductor):
            events.wait_for("job_consumed")
    [claimed] = named(spans, "job from-ci")
    assert format(claimed.context.trace_id, "032x") == trace_id
    assert parent_id(claimed) == int(span_id, 16)
