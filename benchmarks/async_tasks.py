"""Async tasks on the parallel engine: N tasks that each wait (I/O-like), awaited on one loop.

The same flow of ``--tasks`` tasks runs twice on the parallel engine: once with ``async def
execute`` awaiting ``asyncio.sleep(--wait)`` (up to ``max_async_tasks`` at once, on one event
loop thread), once with a plain ``execute`` calling ``time.sleep(--wait)`` on the engine's
thread pool (``--threads``). Prints one JSON document with both run times and their ratio.

Example::

    python benchmarks/async_tasks.py --tasks 1000 --wait 0.1 --threads 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time

from flowengine import engines, task
from flowengine.flows import unordered_flow


class AsyncWait(task.Task):
    wait = 0.1

    async def execute(self) -> None:
        await asyncio.sleep(self.wait)


class ThreadWait(task.Task):
    wait = 0.1

    def execute(self) -> None:
        time.sleep(self.wait)


def _run(kind: type[task.Task], tasks: int, **options: object) -> float:
    flow = unordered_flow.Flow("bench").add(*(kind(f"t{i}") for i in range(tasks)))
    engine = engines.load(flow, engine="parallel", **options)
    engine.compile()
    started = time.perf_counter()
    engine.run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--wait", type=float, default=0.1, help="seconds each task waits")
    parser.add_argument("--threads", type=int, default=8, help="pool threads (both runs)")
    args = parser.parse_args()
    AsyncWait.wait = ThreadWait.wait = args.wait
    async_s = _run(AsyncWait, args.tasks, max_workers=args.threads, max_async_tasks=args.tasks)
    threads_s = _run(ThreadWait, args.tasks, max_workers=args.threads)
    print(json.dumps({
        "benchmark": "async_tasks",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "tasks": args.tasks,
        "wait_s": args.wait,
        "threads": args.threads,
        "async_run_s": round(async_s, 3),
        "threads_run_s": round(threads_s, 3),
        "threads_over_async": round(threads_s / async_s, 1),
        "async_tasks_per_s": round(args.tasks / async_s, 1),
    }, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
