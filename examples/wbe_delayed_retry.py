"""A retry's wait as a delayed dispatch: the next attempt is sent at once and waits out its delay.

A task fails its first attempt; its retry controller (``Times`` with ``delay=2.0``) decides the
second attempt at once, and the worker-based engine sends the task's request right away with
the wait as its delay. No worker may take it before then: on beanstalkd the server holds it (a
delayed job, ``flowengine topics`` counts it under DELAYED); on the other transports, as on the
in-memory one standing in for a broker here, the engine's process holds it and publishes it
when due. Meanwhile the task is stored RUNNING with ``delayed_until`` (``flowengine show``:
DELAYED UNTIL), and ``engine.retry_waits`` (the ``task-delayed`` event) tells when it is due.
See doc/priorities.rst.

Run: python examples/wbe_delayed_retry.py
"""

from __future__ import annotations

import queue
import threading

from worker_processes import serving, wait_until

from flowengine import engines, retry, task
from flowengine.engines import RetryWait
from flowengine.engines.actions import META_DELAYED_UNTIL
from flowengine.flows import linear_flow
from flowengine.worker_based import client as broker_client
from flowengine.worker_based.topics import topic_stats
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-delayed-retry"
TOPIC = "payments"
TRANSPORT = "memory"
#: Seconds the controller waits before each retry.
DELAY = 2.0


class Charge(task.Task):
    """Fails its first attempt (the payment service is "busy"), succeeds after."""

    def execute(self, attempt: int) -> str:
        if attempt == 1:
            raise RuntimeError("payment service busy")
        return f"charged on attempt {attempt}"


def held_here() -> int:
    """Requests this process's broker client holds until their delay ends."""
    return sum(len(client.held) for client in broker_client.clients())


def main() -> None:
    worker = Worker(exchange=EXCHANGE, topic=TOPIC, tasks=[Charge], threads_count=1,
                    transport=TRANSPORT)
    with serving(worker):
        flow = linear_flow.Flow("pay", retry=retry.Times(3, name="again", provides="attempt",
                                                          delay=DELAY))
        flow.add(Charge("charge"))
        engine = engines.load(flow, engine="worker-based", exchange=EXCHANGE, topics=[TOPIC],
                              transport=TRANSPORT)
        waits: queue.Queue[RetryWait] = queue.Queue()
        engine.retry_waits.subscribe(waits.put)
        run = threading.Thread(target=engine.run, daemon=True)
        run.start()
        wait = waits.get(timeout=30)
        print(f"{wait.retry_name} waits {wait.seconds:.1f}s before attempt {wait.attempt}")
        wait_until(lambda: held_here() == 1, "the delayed request")  # sent right after
        storage = engine.storage
        meta = storage.flow_detail.find(storage.get_atom_uuid("charge")).meta
        print(f"charge is {storage.get_atom_state('charge')}, delayed until its due time: "
              f"{meta.get(META_DELAYED_UNTIL) == wait.due}")
        [stats] = topic_stats(EXCHANGE, [TOPIC], transport=TRANSPORT)
        print(f"queued for workers: {stats.ready}, held by this process: {held_here()}")
        run.join(timeout=30)
        print(f"flow {storage.get_flow_state()}: {storage.get('charge')}")


if __name__ == "__main__":
    main()
