"""A frozen worker costs the process one attempt, not one per engine.

Two ``flowengine worker`` processes serve the same task classes, worker ``a`` on topic
``cell-a`` and worker ``b`` on ``cell-b`` (the ``flowengine-fs`` transport: no server). A flow's
task starts on ``a``, and ``a`` is then frozen (SIGSTOP, as a paused VM or a stuck host would
be). Its heartbeats stop, the engine's lease on the attempt lapses after ``lease_timeout``, and
the task runs again on ``b``.

The verdict on ``a`` belongs to the process, not to that one engine: the engines of a process
share one broker client, which tells the others and remembers it for engines made later. So
the flows this process starts next send nothing to ``cell-a``, where the frozen worker would
take nothing until a pickup check passed each request over to ``b`` (5 s or more apiece), and
each engine would find the silence again for itself. They are sent straight to ``b``. Once
``a`` is thawed and heard from again, it is sent work as before.

Run: python examples/wbe_frozen_worker.py
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections import Counter
from typing import Any

import wbe_tasks
from worker_processes import (
    listening_executor,
    start_worker,
    stop_workers,
    wait_until,
    wait_until_known,
)

from flowengine import engines, hooks
from flowengine.flows import linear_flow

EXCHANGE = f"wbe-frozen-{uuid.uuid4().hex[:6]}"
TOPICS = ["cell-a", "cell-b"]
LATER_FLOWS = 4


class SentTo(hooks.Hook):
    """Counts the topics an engine's requests are sent to."""

    def __init__(self) -> None:
        self.topics: Counter[str] = Counter()

    def request_sent(self, headers: Any, atom_uuid: str, *, request_id: str, attempt: int,
                     task_name: str, topic: str) -> None:
        self.topics[topic] += 1


def main() -> None:
    # Listening before the workers start, so their start-up announcements are heard.
    with listening_executor(EXCHANGE, TOPICS, "wbe-frozen-") as (listener, queues):
        signals = queues.parent / "signals"
        signals.mkdir()
        # Short leases, so that the example does not wait long for the verdict.
        options: dict[str, Any] = {
            "exchange": EXCHANGE, "topics": TOPICS, "transport": "flowengine-fs",
            "transport_options": {"data_folder": str(queues)},
            "lease_timeout": 2.0, "heartbeat_interval": 0.5,
        }  # fmt: skip
        workers = []
        try:
            workers.append(start_worker("a", EXCHANGE, "cell-a", ["wbe_tasks"], queues, 2))
            wait_until_known(listener, workers)
            flow = linear_flow.Flow("hold").add(wbe_tasks.HoldOnA("hold"))
            engine = engines.load(flow, engine="worker-based",
                                  store={"signal_folder": str(signals)}, **options)
            running = threading.Thread(target=engine.run, daemon=True)
            running.start()
            wait_until(lambda: (signals / "started-a").exists(), "the task starting on a", 60)
            os.kill(workers[0].process.pid, signal.SIGSTOP)
            print("hold started on worker a, which was then frozen")
            workers.append(start_worker("b", EXCHANGE, "cell-b", ["wbe_tasks"], queues, 2))
            running.join(timeout=60)
            detail = engine.storage.flow_detail.find(engine.storage.get_atom_uuid("hold"))
            attempts = detail.meta.get("attempts") if detail is not None else None
            print(f"hold ran on worker {engine.storage.get('hold')} "
                  f"(attempt {attempts}): {engine.storage.get_flow_state()}")

            sent = SentTo()
            where: Counter[str] = Counter()
            for i in range(LATER_FLOWS):
                later = engines.load(linear_flow.Flow(f"later-{i}").add(
                    wbe_tasks.WhereAmI(f"where-{i}")), engine="worker-based",
                    hooks=[sent], **options)
                later.run()
                where[later.storage.get(f"where-{i}")] += 1
            print(f"{LATER_FLOWS} flows started after the verdict ran on: "
                  + ", ".join(f"{w} x{n}" for w, n in sorted(where.items()))
                  + "; their requests went to: "
                  + ", ".join(f"{t} x{n}" for t, n in sorted(sent.topics.items())))
        finally:
            (signals / "release").touch()  # the thawed worker's task ends
            for worker in workers:
                if worker.process.poll() is None:
                    os.kill(worker.process.pid, signal.SIGCONT)
            stop_workers(workers)


if __name__ == "__main__":
    main()
