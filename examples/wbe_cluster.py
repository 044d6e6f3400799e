"""A linear flow on a worker over a three-node RabbitMQ cluster, with quorum queues.

The engine and a worker (in a thread of this process) are given the cluster's nodes as one
``;`` list of URLs: each connects to the first node that answers and moves to the next when it
loses it. A URL naming several nodes makes flowengine declare quorum queues (replicated on the
cluster's nodes, so they survive the loss of one), with a delivery limit that hands a request
delivered too often to the dead-letter queue. The script prints what it declared, runs the flow,
and removes its queues.

Needs a RabbitMQ cluster (``make test-cluster`` starts one on ports 5681-5683).

Run: python examples/wbe_cluster.py ['amqp://guest:guest@127.0.0.1:5681//;amqp://...']
"""

from __future__ import annotations

import sys
import threading
import uuid

import kombu
import wbe_tasks

from flowengine import engines
from flowengine.flows import linear_flow
from flowengine.worker_based.worker import Worker

TOPIC = "orders"
NODES = ";".join(f"amqp://guest:guest@127.0.0.1:{port}//" for port in (5681, 5682, 5683))


def build_flow() -> linear_flow.Flow:
    return linear_flow.Flow("place-order").add(
        wbe_tasks.ReserveStock("reserve_stock"),
        wbe_tasks.ChargeCard("charge_card"),
        wbe_tasks.ShipOrder("ship_order"),
    )


def main(url: str) -> None:
    exchange = f"wbe-cluster-{uuid.uuid4().hex[:8]}"  # fresh queues for every run
    worker = Worker(exchange=exchange, topic=TOPIC, url=url, threads_count=2,
                    tasks=[wbe_tasks.ReserveStock, wbe_tasks.ChargeCard, wbe_tasks.ShipOrder])
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        if not worker.wait(timeout=30):
            raise RuntimeError("the worker did not start consuming within 30s")
        engine = engines.load(build_flow(), engine="worker-based", exchange=exchange,
                              topics=[TOPIC], url=url,
                              store={"item": "widget", "quantity": 2, "unit_price": 9.99})
        engine.run()
        print(f"result tracking: {engine.storage.fetch('tracking')}")
        print(f"flow state: {engine.storage.get_flow_state()}")
        with kombu.Connection(url) as conn, conn.channel() as channel:
            # A classic declaration of the topic queue is refused: it is a quorum queue.
            try:
                channel.queue_declare(f"{exchange}_{TOPIC}", passive=False, durable=True,
                                      auto_delete=False, arguments={"x-queue-type": "classic"})
                print("topic queue: classic")
            except conn.channel_errors:
                print("topic queue: quorum")
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)
        with kombu.Connection(url) as conn:
            for name in (f"{exchange}_{TOPIC}", f"{exchange}_flowengine.dead-letters"):
                with conn.channel() as channel:
                    channel.queue_delete(name)
            with conn.channel() as channel:
                channel.exchange_delete(exchange)
    print(f"worker stopped: {not thread.is_alive()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else NODES)
