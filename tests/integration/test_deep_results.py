"""A result nested deeper than the wire allows runs once and fails its task, naming the bound.

A flowengine worker checks a reply's nesting as it encodes it (as it checks its size) and sends
a FAILURE that names the bound instead. A TaskFlow worker checks nothing and sends the result;
the engine refuses the reply undecoded and fails the attempt with the same bound named, rather
than waiting on it. Either way the task ran once (the ledger says so), its flow reverts what
ran before it, and the worker is not passed over, shunned or re-dispatched to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import interop_tasks as it
import pytest
from fault_support import WAIT, EngineRuns
from wbe_harness import Broker, WorkerFleet

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf
from flowengine.worker_based import protocol as pr

pytestmark = pytest.mark.integration

TOPIC = "deep"
#: The result's own levels: with the reply's two around it, one past the bound.
TOO_DEEP = pr.MAX_NESTING_DEPTH - 1
FINE = pr.MAX_NESTING_DEPTH - 2


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.jsonl"


def _entries(ledger: Path) -> list[tuple[str, str]]:
    if not ledger.exists():
        return []
    lines = ledger.read_text(encoding="utf-8").splitlines()
    return [(e["event"], e["atom"]) for e in map(json.loads, lines)]


def _flow(depth: int) -> Any:
    return lf.Flow("deep").add(
        it.Reserve("reserve", inject={"item": "widget", "quantity": 1}),
        it.Nested("nested", inject={"depth": depth}, provides="value"))


def _run(engine: Any, runs: EngineRuns) -> BaseException | None:
    # Bounded: before the fix an engine on a TaskFlow worker waited on the refused reply forever.
    return runs.start(engine).join(WAIT)


@pytest.mark.parametrize("library", ["flowengine", "taskflow"])
def test_a_result_too_deep_for_the_wire_runs_once_and_fails_naming_the_bound(
    broker: Broker, exchange: str, fleet_factory: Any, ledger: Path, runs: EngineRuns,
    library: str,
) -> None:  # fmt: skip
    fleet: WorkerFleet = fleet_factory(
        broker, exchange, taskflow_compat=library == "taskflow",
        env={"INTEROP_LEDGER": str(ledger), "INTEROP_TASK_LIBRARY": library})
    if library == "taskflow":
        fleet.start_taskflow(TOPIC, [it.__name__])
    else:
        fleet.start(TOPIC, [it.__name__], threads=2)
    engine = engines.load(_flow(TOO_DEEP), engine="worker-based", **fleet.engine_options(
        TOPIC, transition_timeout=WAIT))

    raised = _run(engine, runs)

    assert isinstance(raised, exc.WrappedFailure), raised
    [failure] = list(raised)
    assert f"deeper than {pr.MAX_NESTING_DEPTH}" in failure.exception_str, failure
    # A flowengine worker names the task; the engine names the request it sent for it.
    assert ("'nested'" if library == "flowengine" else "refused unread") in \
        failure.exception_str, failure
    assert engine.storage.get_flow_state() == states.REVERTED
    assert _entries(ledger) == [("execute", "reserve"), ("execute", "nested"),
                                ("revert", "reserve")]
    detail = engine.storage.flow_detail.find(engine.storage.get_atom_uuid("nested"))
    tried = [(a["action"], a["attempt"]) for a in detail.meta.get("attempt_log", [])]
    assert tried == [("execute", 1), ("revert", 1)], tried  # never sent again


def test_a_result_within_the_bound_travels(
    broker: Broker, exchange: str, fleet_factory: Any, ledger: Path, runs: EngineRuns,
) -> None:  # fmt: skip
    fleet: WorkerFleet = fleet_factory(broker, exchange, env={"INTEROP_LEDGER": str(ledger)})
    fleet.start(TOPIC, [it.__name__], threads=2)
    engine = engines.load(_flow(FINE), engine="worker-based", **fleet.engine_options(
        TOPIC, transition_timeout=WAIT))
    assert _run(engine, runs) is None
    assert pr.exceeds_depth(engine.storage.fetch("value"), FINE - 1)
    assert not pr.exceeds_depth(engine.storage.fetch("value"), FINE)
