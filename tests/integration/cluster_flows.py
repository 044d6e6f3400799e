"""What the cluster suite's broker tests share: gated flows on real workers, and what they check.

Each flow runs a step, then two gated tasks side by side (the fault strikes while they run), then
a task using each gated result and a last step. :func:`start_gated_flows` starts the flows and
returns once every gated task runs; :func:`check_gated_flows` waits for the flows and checks the
ledger: every flow SUCCESS, what completed before the fault and what started after it ran once,
each gated task ended at least once (it was running when the fault struck, so its request may
have been handed out again), and each use got the result its engine stored.
"""

from __future__ import annotations

from typing import Any

import cluster_servers as cs
import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRun, EngineRuns, Stage, logs
from wbe_harness import WorkerFleet, WorkerProcess

from flowengine import engines, states
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

#: The flows each test runs at once.
FLOWS = ("a", "b")


def restored(service: str) -> Any:
    """A fixture: every member of ``service`` runs when the test starts (one an earlier test
    killed is started again)."""

    @pytest.fixture
    def whole(cluster: None) -> None:
        cs.restore(service)

    return whole


def gated_flow(name: str) -> Any:
    """First, two gates side by side, a use of each gate's result, last."""
    return lf.Flow(name).add(
        ft.Step(f"{name}-first"),
        uf.Flow(f"{name}-during").add(ft.Gate(f"{name}-g1", provides="r1"),
                                      ft.Gate(f"{name}-g2", provides="r2")),
        ft.Use(f"{name}-u1", rebind={"value": "r1"}),
        ft.Use(f"{name}-u2", rebind={"value": "r2"}),
        ft.Step(f"{name}-last"),
    )


def start_gated_flows(fleet: WorkerFleet, topic: str, stage: Stage, runs: EngineRuns,
                      **options: Any) -> tuple[dict[str, Any], dict[str, EngineRun]]:
    """Load and start :data:`FLOWS` (engines of this process); return once every gate runs."""
    loaded = {name: engines.load(gated_flow(name), engine="worker-based",
                                 **fleet.engine_options(topic, transition_timeout=4 * WAIT,
                                                        heartbeat_interval=0.5,
                                                        lease_timeout=5.0, **options))
              for name in FLOWS}
    started = {name: runs.start(engine, name) for name, engine in loaded.items()}
    for gate in gates():
        stage.ledger.wait_for(gate, ft.EXECUTE_START)
    return loaded, started


def gates() -> list[str]:
    """The gated tasks of every flow."""
    return [f"{name}-g{i}" for name in FLOWS for i in (1, 2)]


def check_gated_flows(loaded: dict[str, Any], started: dict[str, EngineRun], stage: Stage,
                      workers: list[WorkerProcess]) -> float:
    """Wait for every flow and check what ran (see the module's docstring); return when the
    first task after the gates started (the ledger's clock)."""
    for name, engine in loaded.items():
        assert started[name].join(4 * WAIT, lambda: logs(workers)) is None, logs(workers)
        assert engine.storage.get_flow_state() == states.SUCCESS
        for atom in (f"{name}-first", f"{name}-u1", f"{name}-u2", f"{name}-last"):
            assert len(stage.ledger.starts(atom)) == 1, stage.ledger.dump()
        for i in (1, 2):
            assert stage.ledger.ends(f"{name}-g{i}"), stage.ledger.dump()
            assert [e["value"] for e in stage.ledger.ends(f"{name}-u{i}")] == [
                engine.storage.fetch(f"r{i}")]
    assert all(w.alive for w in workers), logs(workers)
    return float(min(e["t"] for name in FLOWS for i in (1, 2)
                     for e in stage.ledger.starts(f"{name}-u{i}")))
