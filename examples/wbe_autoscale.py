"""A worker whose task threads follow the backlog: ``Worker(autoscale=(MAX, MIN))``.

``flowengine worker --autoscale 4,1`` does the same from the command line. The worker starts
with one thread; four tasks that run side by side grow it to four, and the broker prefetch
follows. Idle threads exit after ten seconds, down to MIN. ``worker.stats()`` tells what the
worker is doing at any moment. Kombu's in-memory transport stands in for a broker.

Run: python examples/wbe_autoscale.py
"""

from __future__ import annotations

import time

from worker_processes import serving

from flowengine import engines, task
from flowengine.flows import unordered_flow
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-autoscale"
TOPIC = "naps"
TRANSPORT = "memory"


class Nap(task.Task):
    """Sleeps a little, so the four of them overlap on the worker."""

    def execute(self) -> str:
        time.sleep(0.5)
        return self.name


def main() -> None:
    worker = Worker(exchange=EXCHANGE, topic=TOPIC, tasks=[Nap], autoscale=(4, 1),
                    transport=TRANSPORT)
    with serving(worker):
        print(f"task threads at start: {worker.threads}")
        flow = unordered_flow.Flow("naps").add(*(Nap(f"nap{n}") for n in range(4)))
        engine = engines.load(flow, engine="worker-based", exchange=EXCHANGE, topics=[TOPIC],
                              transport=TRANSPORT)
        engine.run()
        grown = worker.threads
        print(f"flow {engine.storage.get_flow_state()}")
        print(f"task threads after the backlog: {grown} (the pool grew: {(grown or 0) > 1})")
        # The same figures go out in the worker's heartbeat events (flowengine workers --json).
        now = worker.stats()
        print(f"stats: {now.in_flight} in flight, {now.free_slots} of {now.capacity} slots free,"
              f" prefetch {now.prefetch}")


if __name__ == "__main__":
    main()
