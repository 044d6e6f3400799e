"""One trace across real worker processes, and a killed worker's attempt in it.

The engine runs here with the SDK's in-memory exporter; each ``flowengine worker`` process
writes its spans to a file of its own (:mod:`tracing_bootstrap`, imported as a task module); the
test joins them by trace and span ids. A worker is killed with SIGKILL while it runs a task: its
consumer span dies with it, but the engine's span of the lost attempt ends as ``lost`` and the
re-run's spans (producer linked to the lost one, consumer on the other worker) are there.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fault_tasks as ft
import pytest
import tracing_bootstrap
from fault_support import WAIT, EngineRuns, Stage, by_pid, logs
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from span_capture import captured_spans
from wbe_harness import Broker

from flowengine import engines, states
from flowengine.flows import linear_flow as lf
from flowengine.tracing import names
from flowengine.worker_based import extensions as ext

pytestmark = pytest.mark.integration

TOPIC = "traced"
TASKS = [ft.__name__, tracing_bootstrap.__name__]
LEASE = {"lease_timeout": 2.0, "heartbeat_interval": 0.5}
LAPSE_BOUND = 2.0 + 3.0


@pytest.fixture
def engine_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """This process's spans (the provider is this test's only)."""
    yield from captured_spans(monkeypatch)


def _engine_records(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    """The engine's spans in the shape the workers' files hold."""
    return [json.loads(span.to_json(indent=None)) for span in exporter.get_finished_spans()]


def _worker_records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines() if line]


def _named(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in records if r["name"] == name]


def _attempt(record: dict[str, Any]) -> int:
    return int(record["attributes"][names.REQUEST_ATTEMPT])


def test_one_trace_runs_from_the_flow_to_every_worker_and_keeps_a_killed_workers_attempt(
    rabbitmq_broker: Broker, exchange: str, fleet_factory: Any, stage: Stage,
    runs: EngineRuns, engine_spans: InMemorySpanExporter, tmp_path: Path,
) -> None:  # fmt: skip
    folder = tmp_path / "spans"
    folder.mkdir()
    fleet = fleet_factory(rabbitmq_broker, exchange,
                          env={**stage.env, tracing_bootstrap.SPANS_ENV: str(folder)})
    workers = fleet.start(TOPIC, TASKS, count=2, threads=1)
    flow = lf.Flow("traced").add(ft.Step("first"), ft.Gate("victim", provides="held"),
                                 ft.Step("last"))
    engine = engines.load(flow, engine="worker-based",
                          **fleet.engine_options(TOPIC, transition_timeout=WAIT, **LEASE))
    run = runs.start(engine)
    [start] = stage.ledger.wait_for("victim", ft.EXECUTE_START)
    victim = by_pid(workers, start["pid"])
    victim.signal(signal.SIGKILL)
    [_, again] = stage.ledger.wait_for("victim", ft.EXECUTE_START, count=2,
                                       timeout=LAPSE_BOUND * 2)
    assert again["pid"] != victim.pid, stage.ledger.dump()
    stage.gates.open("victim")
    assert run.join(WAIT) is None, logs(workers)
    assert engine.storage.get_flow_state() == states.SUCCESS
    survivor = by_pid(workers, again["pid"])
    fleet.stop_all()  # every span a live worker ended is in its file once it has exited

    mine, theirs = _engine_records(engine_spans), _worker_records(folder)
    [flow_span] = _named(mine, "flow traced")
    trace_id = flow_span["context"]["trace_id"]
    assert theirs, "the workers wrote no spans"
    assert {r["context"]["trace_id"] for r in mine + theirs} == {trace_id}
    by_id = {r["context"]["span_id"]: r for r in mine}

    for atom in ("first", "last"):
        [ran] = _named(theirs, f"run {atom}")
        sent = by_id[ran["parent_id"]]
        assert sent["name"] == f"send {atom}" and sent["kind"] == "SpanKind.PRODUCER"
        execute = by_id[sent["parent_id"]]
        assert execute["name"] == f"execute {atom}"
        assert execute["parent_id"] == flow_span["context"]["span_id"]
        assert ran["attributes"][names.OUTCOME] == "SUCCESS"

    # The killed worker's attempt: its producer span ended as lost, the re-run links to it.
    lost, kept = sorted(_named(mine, "send victim"), key=_attempt)
    assert (_attempt(lost), _attempt(kept)) == (1, 2)
    assert lost["attributes"][names.OUTCOME] == "lost"
    assert kept["attributes"][names.OUTCOME] == "SUCCESS"
    assert [link["context"]["span_id"] for link in kept["links"]] == [lost["context"]["span_id"]]
    ran_victim = _named(theirs, "run victim")
    [finished] = [r for r in ran_victim if r["attributes"][names.OUTCOME] == "SUCCESS"]
    assert finished["parent_id"] == kept["context"]["span_id"]
    assert str(survivor.pid) in finished["attributes"][names.WORKER].split(":")
    # A redelivered copy of the lost attempt, if the survivor got one, was handed back.
    for other in ran_victim:
        if other is not finished:
            assert other["parent_id"] == lost["context"]["span_id"], other
            assert other["attributes"][names.OUTCOME] == ext.EVENT_REDELIVERED, other
