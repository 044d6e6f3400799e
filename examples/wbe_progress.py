"""Progress from a remote task: a worker process reports it, the engine side shows it.

``CopyFile`` runs in a ``flowengine worker`` process and calls ``update_progress`` after each
chunk. The worker forwards each call as an EVENT message to the engine, which re-emits it on the
engine's copy of the task, so the same ``update_progress`` listeners work as with local engines,
and stores it (``engine.storage.get_task_progress``). The engine itself adds 0% when the task
starts and 100% when it succeeds.

Run: python examples/wbe_progress.py
"""

from __future__ import annotations

import os
import time
from typing import Any

import wbe_tasks
from worker_processes import listening_executor, report_exit, worker_processes

from flowengine import engines, task
from flowengine.flows import linear_flow

EXCHANGE = "wbe-progress"
TOPIC = "files"


def show_progress(_event: str, name: str, started: float, details: dict[str, Any]) -> None:
    bar = "#" * round(details["progress"] * 20)
    print(
        f"progress {name}: {details['progress']:>4.0%} [{bar:<20}]"
        f" +{time.perf_counter() - started:.2f}s"
    )



def main() -> None:
    with listening_executor(EXCHANGE, TOPIC, "flowengine-progress-") as (executor, folder):
        with worker_processes(
            ["worker-1"], executor, EXCHANGE, TOPIC, ["wbe_tasks:CopyFile"], folder,
            on_exit=report_exit,
        ) as (worker,):  # fmt: skip
            print(f"engine pid {os.getpid()}; worker pid {worker.process.pid}")
            copy = wbe_tasks.CopyFile("copy_file")
            started = time.perf_counter()
            copy.notifier.register(
                task.EVENT_UPDATE_PROGRESS, show_progress, args=(copy.name, started)
            )
            flow = linear_flow.Flow("backup").add(copy)
            engine = engines.load(
                flow, engine="worker-based", executor=executor,
                store={"size_mb": 64, "chunks": 5},
            )  # fmt: skip
            engine.run()
            copied = engine.storage.fetch("copied")
            print(f"copied {copied['megabytes']} MB in pid {copied['worker_pid']}")
            progress = engine.storage.get_task_progress("copy_file")
            print(f"stored progress of copy_file: {progress}")
            print(f"flow state: {engine.storage.get_flow_state()}")


if __name__ == "__main__":
    main()
