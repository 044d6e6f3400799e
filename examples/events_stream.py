"""Watch a flow's events as its tasks run on a worker: what ``flowengine events`` shows.

A worker (a thread of this process) and a worker-based engine publish events to the fanout
exchange ``<exchange>.events`` on kombu's in-memory transport; an :class:`EventReceiver` reads
them through a private queue, as ``flowengine events`` does from another terminal (with a real
broker, swap ``transport="memory"`` for a ``url``). The first task reports its progress, which
the engine publishes as ``task-progress``; the second fails: its event carries the exception's
type and message, with the task's secret argument masked.

Run: python examples/events_stream.py
"""

from __future__ import annotations

import threading

from flowengine import engines, task
from flowengine.flows import linear_flow
from flowengine.worker_based.events import EventReceiver
from flowengine.worker_based.worker import Worker

EXCHANGE = "events-demo"
TOPIC = "billing"
TRANSPORT = "memory"


class Reserve(task.Task):
    def execute(self, amount: int) -> str:
        self.update_progress(0.5)
        return f"hold-{amount}"


class Charge(task.Task):
    secret_args = ("card_number",)

    def execute(self, card_number: str, hold: str) -> None:
        raise RuntimeError(f"card {card_number} declined for {hold}")


def main() -> None:
    worker = Worker(EXCHANGE, TOPIC, [Reserve, Charge], threads_count=2, transport=TRANSPORT)
    threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True).start()
    worker.wait(10)
    listening, stop, seen = threading.Event(), threading.Event(), []

    def watch() -> None:
        receiver = EventReceiver(EXCHANGE, transport=TRANSPORT, types=["task-", "flow-"])
        for event in receiver.iter(ready=listening.set, stop=stop):
            seen.append(event)
            if event["type"] in ("flow-succeeded", "flow-reverted", "flow-failed"):
                return

    watcher = threading.Thread(target=watch)
    watcher.start()
    listening.wait(10)
    flow = linear_flow.Flow("pay").add(Reserve("reserve", provides="hold"), Charge("charge"))
    engine = engines.load(flow, store={"amount": 12, "card_number": "4111111111111111"},
                          engine="worker-based", exchange=EXCHANGE, topics=[TOPIC],
                          transport=TRANSPORT)
    try:
        engine.run()
    except Exception as err:
        print(f"flow failed as planned: {type(err).__name__}")
    watcher.join(10)
    stop.set()
    worker.stop(grace=5)
    # Events of two publishers (worker and engine) interleave; each is in its own clock order.
    for event in seen:
        where = "worker" if event.get("type") in ("task-received", "task-started",
                                                   "task-succeeded", "task-failed") else "engine"
        action = event.get("action") or ""
        detail = event.get("exception") or ""
        if event["type"] == "task-progress":
            detail = f"{event['progress']:.0%}"
        print(f"{where:6} {event['type']:15} {event.get('task_name') or '':8} {action:8} "
              f"{detail}".rstrip())


if __name__ == "__main__":
    main()
