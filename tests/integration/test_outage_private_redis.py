"""Redis goes away for longer than a publish used to survive, and comes back with or without
its data (issue 14, items 1-3), on a private Redis server this test starts and stops.

Real ``flowengine worker`` processes; what ran is counted from the tasks' own ledger. Two
engines of the test process (sharing its one broker client) each have two tasks finish while the
broker is down, so their outcomes must wait for it; the flows' next requests go to a broker that
may have forgotten every queue and binding.
"""

from __future__ import annotations

import time
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Stage, logs
from private_redis import PrivateRedis
from wbe_harness import Broker, WorkerFleet

from flowengine import engines, states
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

# Slowest test here: 22 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "outage"
TASKS = [ft.__name__]
#: Seconds Redis stays down: longer than the ~6 s after which a publish used to give up.
OUTAGE = 8.0
#: Task threads per worker: both engines' gated tasks run at once on the two workers.
THREADS = 2
FLOWS = ("o", "p")


def _gated_flow(name: str) -> Any:
    return lf.Flow(name).add(
        ft.Step(f"{name}-first"),
        uf.Flow(f"{name}-during").add(ft.Gate(f"{name}-g1", provides="r1"),
                                      ft.Gate(f"{name}-g2", provides="r2")),
        ft.Use(f"{name}-u1", rebind={"value": "r1"}),
        ft.Use(f"{name}-u2", rebind={"value": "r2"}),
        ft.Step(f"{name}-last"),
    )


def _served_by_both(stage: Stage, runs: EngineRuns, fleet: WorkerFleet, workers: list[Any],
                    name: str) -> None:
    """Four gated tasks run at once on two workers of two threads: neither is wedged."""
    gates = [f"{name}-{i}" for i in range(2 * THREADS)]
    run = runs.start(engines.load(uf.Flow(name).add(*(ft.Gate(g) for g in gates)),
                                  engine="worker-based",
                                  **fleet.engine_options(TOPIC, transition_timeout=WAIT)))
    for gate in gates:
        stage.ledger.wait_for(gate, ft.EXECUTE_START)
    assert {stage.ledger.starts(g)[0]["pid"] for g in gates} == {w.pid for w in workers}
    for gate in gates:
        stage.gates.open(gate)
    assert run.join(WAIT) is None


@pytest.mark.parametrize("keep_data", [
    pytest.param(True, id="data-kept"),
    pytest.param(False, id="data-lost")])
def test_a_long_redis_outage_ends_in_success_without_rerunning_delivered_outcomes(
    keep_data: bool, private_redis: PrivateRedis, exchange: str, fleet_factory: Any,
    stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    broker = Broker("redis", private_redis.url)
    fleet: WorkerFleet = fleet_factory(broker, exchange, env=stage.env)
    workers = fleet.start(TOPIC, TASKS, count=2, threads=THREADS)
    loaded = {name: engines.load(_gated_flow(name), engine="worker-based",
                                 **fleet.engine_options(TOPIC, transition_timeout=4 * WAIT,
                                                        heartbeat_interval=0.5,
                                                        lease_timeout=3.0))
              for name in FLOWS}
    started = {name: runs.start(engine, name) for name, engine in loaded.items()}
    gates = [f"{name}-g{i}" for name in FLOWS for i in (1, 2)]
    for gate in gates:
        stage.ledger.wait_for(gate, ft.EXECUTE_START)

    private_redis.stop(keep_data=keep_data)
    down = time.monotonic()
    # Every gated task finishes while Redis is away: its outcome must wait for it.
    for gate in gates:
        stage.gates.open(gate)
        stage.ledger.wait_for(gate, ft.EXECUTE_END)
    time.sleep(max(0.0, OUTAGE - (time.monotonic() - down)))  # the outage itself
    private_redis.start()

    for name, engine in loaded.items():
        # With the data lost, the first request after the outage used to be dropped now and
        # then: the engine's publisher had declared its topic on a connection the redis client
        # renewed without an error, so kombu skipped declaring it again, and it beat the
        # workers' own declarations (see test_transport_redis.py, "declarations a server
        # forgot"). The flow then waited out its transition timeout.
        assert started[name].join(4 * WAIT, lambda: logs(workers)) is None, logs(workers)
        assert engine.storage.get_flow_state() == states.SUCCESS
        for i in (1, 2):
            result = engine.storage.fetch(f"r{i}")
            assert result["atom"] == f"{name}-g{i}"
            assert [e["value"] for e in stage.ledger.ends(f"{name}-u{i}")] == [result]
        after = [f"{name}-first", f"{name}-u1", f"{name}-u2", f"{name}-last"]
        if keep_data:
            # Every outcome reached its engine once Redis was back: nothing ran twice, though
            # the engines saw no heartbeat for longer than the lease.
            for atom in [*after, f"{name}-g1", f"{name}-g2"]:
                assert len(stage.ledger.starts(atom)) == 1, stage.ledger.dump()
        else:
            # An outcome Redis lost with its data was never delivered and may run again;
            # what ran after the outage ran once, on queues and bindings declared again.
            for atom in (f"{name}-g1", f"{name}-g2"):
                assert stage.ledger.ends(atom), stage.ledger.dump()
            for atom in after:
                assert len(stage.ledger.starts(atom)) == 1, stage.ledger.dump()
    assert all(w.alive for w in workers), logs(workers)
    _served_by_both(stage, runs, fleet, workers, "after")
