"""Atom priority orders the requests waiting in a worker topic's queue: highest first.

Three flows, each with one task of a different ``priority``, send their requests while the
topic is paused, so all three wait in the queue; once resumed, the one-thread worker takes the
most urgent first, whatever order they were sent in. Every transport does this (within its
levels, see doc/priorities.rst); kombu's in-memory transport stands in for a broker here.

Run: python examples/wbe_priorities.py
"""

from __future__ import annotations

import threading

from worker_processes import serving, wait_until

from flowengine import engines, task
from flowengine.flows import linear_flow
from flowengine.worker_based.pause import send_pause
from flowengine.worker_based.topics import topic_stats
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-priorities"
TOPIC = "reports"
TRANSPORT = "memory"
#: The order the worker ran the tasks in (one task thread: one at a time).
SERVED: list[str] = []


class Report(task.Task):
    """Records that it ran."""

    def execute(self) -> None:
        SERVED.append(self.name)


def queued() -> int:
    [stats] = topic_stats(EXCHANGE, [TOPIC], transport=TRANSPORT)
    return stats.ready or 0


def main() -> None:
    worker = Worker(exchange=EXCHANGE, topic=TOPIC, tasks=[Report], threads_count=1,
                    transport=TRANSPORT)
    runs: list[threading.Thread] = []
    with serving(worker):
        send_pause(TOPIC, EXCHANGE, transport=TRANSPORT)
        wait_until(lambda: worker.paused, "the pause")
        for name, priority in (("weekly", 1), ("outage", 9), ("daily", 5)):
            report = Report(name)
            report.priority = priority
            # topics=[]: workers are found by broadcast, so the topic's queue holds requests
            # only (a NOTIFY sent to the topic would wait there too, and be counted).
            engine = engines.load(linear_flow.Flow(name).add(report), engine="worker-based",
                                  exchange=EXCHANGE, topics=[], transport=TRANSPORT)
            runs.append(threading.Thread(target=engine.run, daemon=True))
            runs[-1].start()
            print(f"sent {name} (priority {priority})")
            sent = len(runs)
            wait_until(lambda sent=sent: queued() == sent, f"request {name} queued")
        send_pause(TOPIC, EXCHANGE, paused=False, transport=TRANSPORT)
        for run in runs:
            run.join(timeout=30)
        print(f"served in order: {', '.join(SERVED)}")


if __name__ == "__main__":
    main()
