"""Redis behind three Sentinels fails over to its replica mid-flow.

Real ``flowengine worker`` processes and two engines of the test process reach Redis through the
Sentinels (``sentinel://`` URLs of all three, transport option ``master_name``). While each flow's
gated tasks run, the master is killed with SIGKILL; the Sentinels promote the replica. The gates
open while there is no master, so every outcome waits for the promoted one. What the replica had
not received when its master died is lost with the master: a request or reply that never reached
it must be sent again (by the engine's lease and transition timeout), never silently dropped. Each
flow must end in SUCCESS; what completed before the failover and what started after it ran once.
The time from the kill to the first task of the flows' next step is reported.
"""

from __future__ import annotations

import time
from typing import Any

import cluster_flows as cf
import cluster_servers as cs
import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Stage, wait_until
from wbe_harness import Broker, WorkerFleet

from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import proxy as px

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(240)]

TOPIC = "sentinel"
TASKS = [ft.__name__]
restored = cf.restored("redis")
OPTIONS = {"master_name": cs.MASTER_NAME}


def test_a_sentinel_failover_mid_flow_ends_every_flow_in_success(
        restored: None, exchange: str, fleet_factory: Any, stage: Stage,
        runs: EngineRuns) -> None:
    master = cs.redis_master_port()
    # The harness's own short connections (announcement watcher, clean-up) go to the master
    # directly; workers and engines go through the Sentinels.
    broker = Broker("redis-sentinel", f"redis://127.0.0.1:{master}/0")
    fleet: WorkerFleet = fleet_factory(
        broker, exchange, env=stage.env, url=cs.sentinel_url(),
        worker_args=["--transport-option", f"master_name={cs.MASTER_NAME}"])
    workers = fleet.start(TOPIC, TASKS, count=2, threads=2)
    loaded, started = cf.start_gated_flows(fleet, TOPIC, stage, runs,
                                           transport_options=OPTIONS)

    cs.kill_redis(master)
    killed = time.time()
    for gate in cf.gates():
        stage.gates.open(gate)
    promoted = wait_until(lambda: (port := cs.redis_master_port()) != master and port,
                          WAIT, "the Sentinels to promote the replica")
    promoted_at = time.time()

    recovered = cf.check_gated_flows(loaded, started, stage, workers)
    cs.report("redis sentinel failover: replica promoted", promoted_at - killed,
              promoted=promoted)
    cs.report("redis sentinel failover (next task started)", recovered - killed,
              workers=len(workers), flows=len(cf.FLOWS))


def test_messages_through_the_sentinels_are_delivered_highest_priority_first(
        cluster: None, exchange: str) -> None:
    # Sentinel URLs get flowengine's Redis channel, which orders by priority as AMQP does.
    proxy = px.Proxy("ordered", exchange, url=cs.sentinel_url(), transport_options=OPTIONS)
    try:
        assert proxy.traits.priorities
        for number, priority in enumerate((0, 9, 5)):
            proxy.publish(_Note(number), "ordered", priority=priority)
        taken = [proxy.take("ordered", lambda _m: True) for _ in range(3)]
        assert [m.json()["number"] for m in taken if m is not None] == [1, 2, 0]
    finally:
        proxy.delete_own_queue()
        proxy.close()


class _Note(pr.Message):
    TYPE = pr.NOTIFY

    def __init__(self, number: int) -> None:
        self.number = number

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number}
