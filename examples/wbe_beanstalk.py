"""A linear flow on a worker over beanstalkd, and what the server shows of it.

The engine and a worker (in a thread of this process) talk through a beanstalkd server: the
worker's queue is a tube, each request a job reserved with a time-to-run equal to the engine's
lease, which the worker's heartbeats ``touch`` while a task runs. Afterwards the script reads
the tube's counters (``stats-tube``) the way any beanstalkd tool would, then the exchange's
topics as ``flowengine topics --url URL --exchange EXCHANGE`` shows them.

Needs a beanstalkd (``beanstalkd -l 127.0.0.1 -p 11300``) and ``pip install
'flowengine[beanstalk]'``.

Run: python examples/wbe_beanstalk.py [beanstalk://127.0.0.1:11300]
"""

from __future__ import annotations

import sys
import threading
import uuid

import greenstalk
import kombu
import wbe_tasks

from flowengine import engines
from flowengine.flows import linear_flow
from flowengine.worker_based.broker import transport_beanstalk
from flowengine.worker_based.topics import topic_stats
from flowengine.worker_based.worker import Worker

TOPIC = "orders"


def build_flow() -> linear_flow.Flow:
    return linear_flow.Flow("place-order").add(
        wbe_tasks.ReserveStock("reserve_stock"),
        wbe_tasks.ChargeCard("charge_card"),
        wbe_tasks.ShipOrder("ship_order"),
    )


def show_tube(url: str, queue: str) -> None:
    host, port = url.split("://", 1)[1].split(":")
    with greenstalk.Client((host, int(port))) as client:
        stats = client.stats_tube(transport_beanstalk.tube_name(queue))
    print(f"tube {queue}: {stats['total-jobs']} jobs in all, {stats['current-jobs-ready']} "
          f"ready, {stats['current-jobs-reserved']} reserved, "
          f"{stats['current-jobs-buried']} buried")


def main(url: str) -> None:
    exchange = f"wbe-beanstalk-{uuid.uuid4().hex[:8]}"  # fresh tubes for every run
    worker = Worker(exchange=exchange, topic=TOPIC, url=url, threads_count=2,
                    tasks=[wbe_tasks.ReserveStock, wbe_tasks.ChargeCard, wbe_tasks.ShipOrder])
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        if not worker.wait(timeout=10):
            raise RuntimeError(f"the worker did not start consuming {url} within 10s")
        engine = engines.load(build_flow(), engine="worker-based", exchange=exchange,
                              topics=[TOPIC], url=url, lease_timeout=10.0,
                              store={"item": "widget", "quantity": 2, "unit_price": 9.99})
        engine.run()
        print(f"result tracking: {engine.storage.fetch('tracking')}")
        print(f"flow state: {engine.storage.get_flow_state()}")
        show_tube(url, f"{exchange}_{TOPIC}")
        for row in topic_stats(exchange, url=url):  # what `flowengine topics` prints
            print(f"topic {row.topic}: ready={row.ready} running={row.running} "
                  f"delayed={row.delayed} dead={row.dead} workers={row.workers}")
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)
        with kombu.Connection(url) as conn, conn.channel() as channel:
            channel.exchange_delete(exchange)  # its bindings and queues, kept on the server
    print(f"worker stopped: {not thread.is_alive()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "beanstalk://127.0.0.1:11300")
