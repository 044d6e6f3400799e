"""One worker process, many concurrent async tasks: ``--tasks`` × ``asyncio.sleep(--wait)``.

A worker-based engine in this process runs an unordered flow of ``--tasks`` tasks on ONE
``flowengine worker`` process, twice:

- ``async``: each task is ``async def execute`` awaiting ``asyncio.sleep(--wait)``; the worker
  awaits up to ``--async-concurrency`` of them at once on its event loop (its task threads stay
  free). Ideally the whole flow takes ``--wait`` seconds plus the messaging overhead.
- ``threads``: each task is a plain ``execute`` calling ``time.sleep(--wait)`` on a worker of
  ``--threads`` task threads: ``ceil(tasks / threads)`` rounds of ``--wait`` at best.

Prints one JSON document: each run's wall time, its ratio to ``--wait`` and to its ideal, and
how much faster the async worker was. The broker is flowengine's filesystem transport in a
temporary folder unless ``--url`` names one (``amqp://guest:guest@127.0.0.1:5672//``).

Example::

    python benchmarks/async_worker.py --tasks 1000 --wait 1 --threads 50
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowengine import engines
from flowengine.flows import unordered_flow
from flowengine.worker_based import client as broker_clients
from flowengine.worker_based.executor import WorkerTaskExecutor

TOPIC = "async-bench"
TASKS_MODULE = "async_worker_tasks"
#: The task classes, written to a module the worker imports by name (as the engine names them).
TASKS_SOURCE = '''
import asyncio
import time

from flowengine import task


class AsyncSleep(task.Task):
    async def execute(self, seconds):
        await asyncio.sleep(seconds)


class ThreadSleep(task.Task):
    def execute(self, seconds):
        time.sleep(seconds)
'''
#: Seconds a worker gets to announce itself.
START_TIMEOUT = 60.0


def _broker(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    if args.url:
        return {"url": args.url}
    return {"transport_options": {"data_folder": os.path.join(folder, "broker")}}


def _cli_broker(options: dict[str, Any]) -> list[str]:
    if "url" in options:
        return ["--url", options["url"]]
    return ["--transport-option", f"data_folder={options['transport_options']['data_folder']}"]


@contextlib.contextmanager
def worker_process(exchange: str, options: dict[str, Any], folder: str,
                   extra: list[str]) -> Iterator[int]:
    """One ``flowengine worker`` serving the benchmark's tasks; yields its pid once announced."""
    command = [sys.executable, "-m", "flowengine.cli.main", "worker", "--exchange", exchange,
               "--topic", TOPIC, "--task", TASKS_MODULE, "--log-level", "WARNING",
               "--no-events", "--grace", "10", *_cli_broker(options), *extra]
    log = Path(folder, f"worker-{uuid.uuid4().hex[:6]}.log")
    listener = WorkerTaskExecutor(uuid.uuid4().hex, exchange, [TOPIC], **options)
    listener.start()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=folder, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while listener.wait_for_workers(1, timeout=0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not come up: "
                                   f"{log.read_text(errors='replace')[-800:]}")
        listener.stop()
        yield proc.pid
    finally:
        listener.stop()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_flow(task_cls: type[Any], tasks: int, wait: float, exchange: str,
             options: dict[str, Any]) -> float:
    """Seconds the worker-based engine takes to run ``tasks`` of ``task_cls`` at once."""
    flow = unordered_flow.Flow("bench").add(
        *(task_cls(f"t{i}", inject={"seconds": wait}) for i in range(tasks)))
    engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                          transition_timeout=max(120.0, 4 * wait * tasks), **options)
    engine.compile()
    engine.prepare()
    started = time.perf_counter()
    engine.run()
    return time.perf_counter() - started


def _row(wall: float, wait: float, ideal: float) -> dict[str, float]:
    return {"wall_s": round(wall, 3), "vs_wait": round(wall / wait, 2),
            "ideal_s": round(ideal, 3), "vs_ideal": round(wall / ideal, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--wait", type=float, default=1.0, help="seconds each task sleeps")
    parser.add_argument("--threads", type=int, default=50,
                        help="task threads of the thread-only worker (and of the async one)")
    parser.add_argument("--async-concurrency", type=int, default=None,
                        help="the async worker's slots (default: --tasks)")
    parser.add_argument("--url", default=None, help="broker URL (default: filesystem transport)")
    parser.add_argument("--no-threads", action="store_true",
                        help="skip the thread-only run")
    args = parser.parse_args()
    slots = args.async_concurrency or args.tasks
    with tempfile.TemporaryDirectory(prefix="async-worker-bench-") as folder:
        Path(folder, f"{TASKS_MODULE}.py").write_text(TASKS_SOURCE)
        sys.path.insert(0, folder)
        module = __import__(TASKS_MODULE)
        options = _broker(args, folder)
        report: dict[str, Any] = {
            "benchmark": "async_worker", "python": platform.python_version(),
            "broker": "url" if args.url else "fs", "tasks": args.tasks, "wait_s": args.wait,
            "threads": args.threads, "async_concurrency": slots, "worker_processes": 1}
        exchange = f"async-bench-{uuid.uuid4().hex[:8]}"
        with worker_process(exchange, options, folder,
                            ["--threads", str(args.threads), "--async-concurrency", str(slots)]):
            wall = run_flow(module.AsyncSleep, args.tasks, args.wait, exchange, options)
        rounds = math.ceil(args.tasks / slots)
        report["async"] = _row(wall, args.wait, rounds * args.wait)
        if not args.no_threads:
            exchange = f"async-bench-{uuid.uuid4().hex[:8]}"
            with worker_process(exchange, options, folder, ["--threads", str(args.threads)]):
                wall = run_flow(module.ThreadSleep, args.tasks, args.wait, exchange, options)
            rounds = math.ceil(args.tasks / args.threads)
            report["threads_only"] = _row(wall, args.wait, rounds * args.wait)
            report["threads_over_async"] = round(
                report["threads_only"]["wall_s"] / report["async"]["wall_s"], 1)
        # The engines' broker client lives on (and redeclares its queues) until closed: it
        # must not look for the folder while the directory's clean-up deletes it.
        broker_clients.close_all()
    print(json.dumps(report, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
