"""A three-node RabbitMQ cluster loses the node everything is connected to, mid-flow.

Real ``flowengine worker`` processes and two engines of the test process are given the cluster as a
``;`` list of node URLs (node 1 first, so all of them connect there), which makes their queues
quorum queues. While each flow's gated tasks run on the workers, node 1 is killed with SIGKILL; then
the gates open, so every outcome is published after the node died. Each flow must end in SUCCESS,
what completed before the kill and what started after it must have run once (the ledger the tasks
write says so), the event stream must go on delivering, and the time from the kill to the first task
of the flows' next step is reported as the recovery time. Quorum-queue facts (declarations, the
delivery limit's dead-letter path, no global prefetch) are checked against the same cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import cluster_flows as cf
import cluster_servers as cs
import fault_tasks as ft
import kombu
import pytest
from event_collector import Collector
from fault_support import WAIT, EngineRuns, Stage, wait_until
from wbe_harness import Broker, WorkerFleet

from flowengine.worker_based import dead_letters as dl
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.events import EventReceiver

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(240)]

TOPIC = "cluster"
TASKS = [ft.__name__]
restored = cf.restored("rabbitmq")


def test_losing_the_node_everyone_uses_ends_every_flow_in_success_running_each_atom_once(
        restored: None, exchange: str, fleet_factory: Any, stage: Stage,
        runs: EngineRuns) -> None:
    broker = Broker("rabbitmq-cluster", cs.rabbit_urls(first=1))
    fleet: WorkerFleet = fleet_factory(broker, exchange, env=stage.env)
    workers = fleet.start(TOPIC, TASKS, count=2, threads=2)
    collector = Collector(EventReceiver(exchange, url=broker.url))
    try:
        loaded, started = cf.start_gated_flows(fleet, TOPIC, stage, runs)
        assert cs.rabbit_queue_types(exchange)[f"{exchange}_{TOPIC}"] == "quorum"

        cs.kill_rabbit(1)
        killed = time.time()
        for gate in cf.gates():
            stage.gates.open(gate)
        # What completed before the kill, and what started after it, ran once. The gated
        # tasks were running when their workers' node died: the broker gave their requests
        # to a worker again, which handed them back to their engines, so they may have run
        # twice (at least once, as through a single broker's restart).
        recovered = cf.check_gated_flows(loaded, started, stage, workers)
        # The event stream was read through the kill: the flows' ends arrived after it.
        ended = collector.wait_for(lambda events: sum(
            e["type"] == "flow-succeeded" for e in events) >= len(cf.FLOWS))
        assert any(e["type"] == "flow-succeeded" and e.get("local_received", 0) > killed
                   for e in ended)
    finally:
        collector.close()
    cs.report("rabbitmq node kill -9 (next task started)", recovered - killed,
              nodes=3, workers=len(workers), flows=len(cf.FLOWS))


def test_quorum_queues_take_no_priority_argument_and_dead_letter_past_the_delivery_limit(
        cluster: None, exchange: str) -> None:
    url = cs.rabbit_urls()
    topic = f"limited-{uuid.uuid4().hex[:6]}"
    proxy = px.Proxy(topic, exchange, url=url, transport_options={"delivery_limit": 2})
    letters = dl.DeadLetters(exchange, url=url)
    try:
        assert proxy.queue_kind.quorum and proxy.queue_kind.delivery_limit == 2
        # A request published with a priority is accepted: quorum queues are declared without
        # x-max-priority (RabbitMQ refuses it on them) and the property is only a hint.
        proxy.publish(_Request(), topic, correlation_id="req-1", priority=5,
                      headers={"x-flowengine-request-id": "req-1"})
        # Three deliveries given back: the third is past the limit of two.
        with kombu.Connection(url) as conn, conn.channel() as channel:
            queue = kombu.Queue(f"{exchange}_{topic}", channel=channel, no_declare=True)
            for _ in range(3):
                message = _get(queue)
                message.requeue()
        # Quorum queues dead-letter in the background: wait for the letter to arrive.
        found = wait_until(letters.list, WAIT, "the dead letter")
        assert [(letter.id, letter.topic) for letter in found] == [("req-1", topic)]
        assert "delivery limit" in found[0].reason
    finally:
        letters.close()
        proxy.delete_own_queue()
        proxy.close()


class _Request(pr.Message):
    TYPE = pr.REQUEST

    def to_dict(self) -> dict[str, Any]:
        return {"task_cls": "t.T", "task_name": "t", "task_version": [1, 0],
                "action": "execute", "arguments": {}}


def _get(queue: kombu.Queue) -> Any:
    deadline = time.monotonic() + WAIT
    while (message := queue.get(no_ack=False)) is None:
        assert time.monotonic() < deadline, "no message came back"
        time.sleep(0.05)  # the broker requeues it: nothing to wait on
    return message



def test_the_cluster_example_runs_a_flow_on_quorum_queues(cluster: None) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONIOENCODING="utf-8")
    proc = subprocess.run([sys.executable, str(root / "examples" / "wbe_cluster.py"),
                           cs.rabbit_urls()], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "result tracking: trk-rsv-widget-2" in lines and "flow state: SUCCESS" in lines
    assert "topic queue: quorum" in lines and lines[-1] == "worker stopped: True"


def test_a_quorum_queue_consumer_follows_a_prefetch_that_grows(cluster: None,
                                                                exchange: str) -> None:
    # Quorum queues refuse a channel-wide (global) prefetch, and a per-consumer one reaches
    # only consumers started after it: a worker whose pool grows consumes anew.
    limit = [1]
    held: list[Any] = []
    proxy = px.Proxy("growing", exchange, url=cs.rabbit_urls(),
                     type_handlers={pr.REQUEST: dp.Handler(
                         lambda _data, delivery: held.append(delivery), manual_ack=True)},
                     prefetch=lambda: limit[0])
    consumer = threading.Thread(target=proxy.start, daemon=True)
    try:
        for number in range(4):
            proxy.publish(_Request(), "growing", correlation_id=f"req-{number}")
        consumer.start()
        wait_until(lambda: len(held) == 1, WAIT, "the first delivery")
        limit[0] = 3
        # Three more: the first is still held by the consumer the limit was not raised for.
        wait_until(lambda: len(held) == 4, WAIT, "three more deliveries under a prefetch of 3")
        for delivery in held:
            delivery.ack()
    finally:
        proxy.stop()
        proxy.wait_stopped(WAIT)
        proxy.delete_own_queue()
        proxy.close()
