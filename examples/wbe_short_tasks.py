"""Short tasks with one message each way: the worker-based engine's ``quiet_start`` option.

A remote task costs three broker messages in TaskFlow's protocol: the request, the worker's
RUNNING reply and the outcome. With ``quiet_start`` on, a worker that has seen a task end within
0.2 s starts it quietly: a task that ends that soon replies with its outcome alone, and one
that runs longer says RUNNING at 0.2 s. States and results read the same either way.

It is on by default only on AMQP brokers (RabbitMQ), which hand back at once what a killed or
frozen worker held; elsewhere a worker lost in a quiet task's first moments would be found
late (doc/workers.rst, "Short tasks"), so the default there is RUNNING first. This script runs
on the in-memory transport, where the default is off, and turns it on.

Run: python examples/wbe_short_tasks.py
"""

from __future__ import annotations

import threading

from flowengine import engines, task
from flowengine.flows import linear_flow
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-short-tasks"
TOPIC = "steps"
TRANSPORT = "memory"
STEPS = 20


class AddOne(task.Task):
    """A short task: adds one to the running total."""

    def execute(self, total: int) -> int:
        return total + 1


def build_flow() -> linear_flow.Flow:
    # Each step reads the total the one before provided.
    steps = [AddOne(f"step{i}", provides=f"total{i + 1}", rebind={"total": f"total{i}"})
             for i in range(STEPS)]
    return linear_flow.Flow("count-up").add(*steps)


def run(quiet_start: bool | None) -> None:
    options = {} if quiet_start is None else {"quiet_start": quiet_start}
    engine = engines.load(build_flow(), engine="worker-based", exchange=EXCHANGE,
                          topics=[TOPIC], transport=TRANSPORT, store={"total0": 0}, **options)
    engine.run()
    said = "default" if quiet_start is None else f"quiet_start={quiet_start}"
    executor = engine.worker_executor
    print(f"{said}: quiet starts {'on' if executor.quiet_starts else 'off'}, "
          f"total {engine.storage.fetch(f'total{STEPS}')}, "
          f"flow {engine.storage.get_flow_state()}")


def main() -> None:
    worker = Worker(exchange=EXCHANGE, topic=TOPIC, tasks=[AddOne], threads_count=2,
                    transport=TRANSPORT)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        if not worker.wait(timeout=10):
            raise RuntimeError("the worker did not start consuming within 10s")
        run(None)  # RUNNING first: the memory transport is not an AMQP broker
        run(True)  # after the first step, each short step replies with its outcome alone
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)


if __name__ == "__main__":
    main()
