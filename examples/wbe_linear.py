"""A linear flow on the worker-based engine, with its worker running in a thread of this process.

The engine and the worker talk only through messages on kombu's in-memory transport, exactly as
they would through RabbitMQ or Redis between machines (swap ``transport="memory"`` for a ``url``).
The worker runs the task classes of ``wbe_tasks.py``; the engine sends it one request per task,
in flow order, and stores each result as it comes back.

Run: python examples/wbe_linear.py
"""

from __future__ import annotations

import threading

import wbe_tasks

from flowengine import engines
from flowengine.flows import linear_flow
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-linear"
TOPIC = "orders"
TRANSPORT = "memory"


def build_flow() -> linear_flow.Flow:
    return linear_flow.Flow("place-order").add(
        wbe_tasks.ReserveStock("reserve_stock"),
        wbe_tasks.ChargeCard("charge_card"),
        wbe_tasks.ShipOrder("ship_order"),
    )


def main() -> None:
    worker = Worker(
        exchange=EXCHANGE,
        topic=TOPIC,
        tasks=[wbe_tasks.ReserveStock, wbe_tasks.ChargeCard, wbe_tasks.ShipOrder],
        threads_count=2,
        transport=TRANSPORT,
    )
    print(f"worker serves: {', '.join(str(e) for e in worker.endpoints)}")
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        if not worker.wait(timeout=10):
            raise RuntimeError("the worker did not start consuming within 10s")
        engine = engines.load(
            build_flow(),
            engine="worker-based",
            exchange=EXCHANGE,
            topics=[TOPIC],
            transport=TRANSPORT,
            store={"item": "widget", "quantity": 2, "unit_price": 9.99},
        )
        engine.run()
        for name in ("reservation", "payment", "tracking"):
            print(f"result {name}: {engine.storage.fetch(name)}")
        print(f"flow state: {engine.storage.get_flow_state()}")
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)
    print(f"worker stopped: {not thread.is_alive()}")


if __name__ == "__main__":
    main()
