"""Many flows at once in one process, each with its own worker-based engine on its own thread.

This is how an orchestration service runs: a request comes in, a flow is loaded with
``engines.load(..., engine="worker-based")`` and run. Every such engine of the process shares
one broker client (one reply queue, one consumer thread, a few publishing connections), so the
process holds the same few threads and sockets whether it runs one flow or thousands. The
worker runs in a thread here, over kombu's in-memory transport; swap ``transport="memory"``
for a ``url`` to use RabbitMQ or Redis.

Run: python examples/wbe_many_flows.py
"""

from __future__ import annotations

import threading

import wbe_tasks

from flowengine import engines, states
from flowengine.flows import linear_flow
from flowengine.worker_based import client
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-many"
TOPIC = "orders"
TRANSPORT = "memory"
FLOWS = 50


def order(i: int) -> tuple[linear_flow.Flow, dict[str, object]]:
    flow = linear_flow.Flow(f"order-{i}").add(
        wbe_tasks.ReserveStock("reserve_stock"),
        wbe_tasks.ChargeCard("charge_card"),
        wbe_tasks.ShipOrder("ship_order"),
    )
    return flow, {"item": f"widget-{i}", "quantity": 1, "unit_price": 1.0}


def main() -> None:
    worker = Worker(exchange=EXCHANGE, topic=TOPIC, threads_count=8, transport=TRANSPORT,
                    tasks=[wbe_tasks.ReserveStock, wbe_tasks.ChargeCard, wbe_tasks.ShipOrder])
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    if not worker.wait(timeout=10):
        raise RuntimeError("the worker did not start consuming within 10s")
    outcomes: dict[int, str] = {}
    peak = {"threads": 0, "clients": 0}

    def run(i: int) -> None:
        flow, store = order(i)
        engine = engines.load(flow, engine="worker-based", exchange=EXCHANGE, topics=[TOPIC],
                              transport=TRANSPORT, store=store)
        engine.run()
        tracking = engine.storage.fetch("tracking")
        outcomes[i] = f"{engine.storage.get_flow_state()} {tracking}"
        ours = [t for t in threading.enumerate() if t.name.startswith("flowengine-client")]
        peak["threads"] = max(peak["threads"], len(ours))
        peak["clients"] = max(peak["clients"], len(client.clients()))

    try:
        runners = [threading.Thread(target=run, args=(i,)) for i in range(FLOWS)]
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join(60)
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)
    done = sum(1 for text in outcomes.values() if text.startswith(states.SUCCESS))
    print(f"order 7: {outcomes.get(7)}")
    print(f"flows: {FLOWS}, succeeded: {done}")
    print(f"broker clients in this process: {peak['clients']}")
    print(f"reply consumer threads: {peak['threads']}")


if __name__ == "__main__":
    main()
