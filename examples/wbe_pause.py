"""Pausing a worker topic, then resuming it: the flow waits in the queue, then runs.

``send_pause`` is what ``flowengine topics pause TOPIC [--for SECONDS]`` and ``flowengine
topics resume TOPIC`` send: a control message every flowengine worker hears and those on the
topic obey. A paused worker takes no new request (the ones it runs finish); the requests wait
in the queue, and resuming takes them up. Kombu's in-memory transport stands in for a broker.

Run: python examples/wbe_pause.py
"""

from __future__ import annotations

import threading

import wbe_tasks
from worker_processes import serving, wait_until

from flowengine import engines
from flowengine.flows import linear_flow
from flowengine.worker_based.pause import send_pause
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-pause"
TOPIC = "orders"
TRANSPORT = "memory"


def main() -> None:
    worker = Worker(exchange=EXCHANGE, topic=TOPIC, threads_count=2, transport=TRANSPORT,
                    tasks=[wbe_tasks.ReserveStock, wbe_tasks.ChargeCard, wbe_tasks.ShipOrder])
    with serving(worker):
        send_pause(TOPIC, EXCHANGE, transport=TRANSPORT)
        wait_until(lambda: worker.paused, "the pause")
        print(f"topic {TOPIC} paused: {worker.paused}")

        flow = linear_flow.Flow("place-order").add(wbe_tasks.ReserveStock("reserve_stock"))
        engine = engines.load(flow, engine="worker-based", exchange=EXCHANGE, topics=[TOPIC],
                              transport=TRANSPORT, store={"item": "widget", "quantity": 2})
        running = threading.Thread(target=engine.run, daemon=True)
        running.start()
        running.join(timeout=1.0)  # a second with the request in the queue, not taken
        print(f"after 1s paused, the flow is still running: {running.is_alive()}")

        send_pause(TOPIC, EXCHANGE, paused=False, transport=TRANSPORT)
        running.join(timeout=30)
        print(f"after resume: flow {engine.storage.get_flow_state()}, "
              f"reservation {engine.storage.fetch('reservation')}")


if __name__ == "__main__":
    main()
