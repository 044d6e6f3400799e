"""Tracing on, TaskFlow peers on the other side: nothing they see changes, nothing breaks.

The interop order flow (see :mod:`test_taskflow_interop`) with a traced flowengine engine on a
TaskFlow worker, and a TaskFlow engine on a traced flowengine worker. TaskFlow ignores the
``traceparent``/``tracestate`` headers; the outcomes, ledgers and reverts are exactly those of the
untraced runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import interop_engine
import pytest
import tracing_bootstrap
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from span_capture import captured_spans
from test_taskflow_interop import TOPIC, check, read_ledger, run_engine
from wbe_harness import Broker

from flowengine.tracing import names

pytestmark = pytest.mark.integration


@pytest.fixture
def engine_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    yield from captured_spans(monkeypatch)


def test_a_traced_flowengine_engine_runs_on_taskflow_workers(
    rabbitmq_broker: Broker, exchange: str, fleet_factory: Any, tmp_path: Path,
    engine_spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    ledger = tmp_path / "ledger.jsonl"
    fleet = fleet_factory(rabbitmq_broker, exchange, taskflow_compat=True, env={
        "INTEROP_LEDGER": str(ledger), "INTEROP_TASK_LIBRARY": "taskflow"})
    worker = fleet.start_taskflow(TOPIC, ["interop_tasks"])
    monkeypatch.setenv("INTEROP_LEDGER", str(ledger))
    outcome = interop_engine.main("flowengine", rabbitmq_broker.url, exchange, TOPIC)
    check(json.loads(json.dumps(outcome, default=repr)), read_ledger(ledger), "taskflow",
          worker.pid)
    finished = engine_spans.get_finished_spans()
    assert [s.attributes[names.OUTCOME] for s in finished if s.name == "flow order"] == [
        "SUCCESS", "REVERTED"]
    sent = [s for s in finished if s.name.startswith("send ")]
    assert len(sent) == 9  # three executions, three more, three reverts
    assert {s.attributes[names.OUTCOME] for s in sent} == {"SUCCESS", "FAILURE", "REVERTED"}


def test_a_taskflow_engine_runs_on_traced_flowengine_workers(
    rabbitmq_broker: Broker, exchange: str, fleet_factory: Any, tmp_path: Path,
) -> None:  # fmt: skip
    ledger, folder = tmp_path / "ledger.jsonl", tmp_path / "spans"
    folder.mkdir()
    fleet = fleet_factory(rabbitmq_broker, exchange, taskflow_compat=True, env={
        "INTEROP_LEDGER": str(ledger), "INTEROP_TASK_LIBRARY": "flowengine",
        tracing_bootstrap.SPANS_ENV: str(folder)})
    [worker] = fleet.start(TOPIC, ["interop_tasks", tracing_bootstrap.__name__], threads=2)
    outcome = run_engine("taskflow", rabbitmq_broker, exchange, ledger)
    check(outcome, read_ledger(ledger), "flowengine", worker.pid)
    fleet.stop_all()
    spans = [json.loads(line) for path in folder.glob("*.jsonl")
             for line in path.read_text(encoding="utf-8").splitlines()]
    # A TaskFlow engine sends no trace context: each request is a trace of its own.
    assert len(spans) == 9 and all(s["parent_id"] is None for s in spans), spans
    assert sorted(s["name"] for s in spans) == sorted(
        ["run reserve", "run charge", "run ship"] * 3)
