"""What the event stream costs: the same worker-based runs with events off, on, and on and read.

Two in-process workers (threads, ``--threads`` task threads each; one with events, one without,
each on its own topic) serve a worker-based engine over the chosen transport (``memory`` by
default, ``flowengine-fs``, or a broker ``--url``). Each mode runs an unordered flow of
``--tasks`` no-op tasks (throughput) and a linear one of ``--linear`` (latency) ``--repeat``
times, the modes taking turns so that drift hits all alike, and reports the median:

- ``off``: ``events=False`` on the worker and the engine;
- ``on``: the defaults (events published; nobody listening);
- ``on_read``: the defaults with an :class:`EventReceiver` reading every event.

Prints one JSON document with each mode's seconds and tasks/s and ``ratio`` (mode time / off time;
1.05 means 5% slower), plus the events published and dropped, and ``emit_away``: what one
``emit`` costs the caller while the broker is unreachable (``--away-emits`` events to a closed
port; they are queued or dropped, never waited on). Example::

    python benchmarks/events_cost.py --tasks 200 --repeat 5
    python benchmarks/events_cost.py --url redis://127.0.0.1:6379/15
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from flowengine import engines, task
from flowengine.flows import linear_flow, unordered_flow
from flowengine.worker_based import events as ev
from flowengine.worker_based.broker.proxy import mask_url
from flowengine.worker_based.worker import Worker

MODES = ("off", "on", "on_read")


class Noop(task.Task):
    def execute(self) -> None:
        return None


def _broker(args: argparse.Namespace) -> dict[str, Any]:
    if args.url:
        return {"url": args.url}
    options = {"data_folder": tempfile.mkdtemp(prefix="events-cost-")} \
        if args.transport == "flowengine-fs" else {}
    return {"transport": args.transport, "transport_options": options}


def _run(shape: str, size: int, exchange: str, topic: str, broker: dict[str, Any],
         events: bool) -> float:
    pattern = linear_flow if shape == "linear" else unordered_flow
    flow = pattern.Flow(shape).add(*[Noop(f"t{i}") for i in range(size)])
    engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[topic],
                          events=events, **broker)
    engine.compile()
    engine.prepare()
    started = time.perf_counter()
    engine.run()
    return time.perf_counter() - started


def _drain(receiver: ev.EventReceiver, ready: threading.Event, stop: threading.Event) -> None:
    for _event in receiver.iter(ready=ready.set, stop=stop):
        pass


def _timed(mode: str, shape: str, size: int, exchange: str, broker: dict[str, Any]) -> float:
    if mode != "on_read":
        return _run(shape, size, exchange, mode, broker, events=mode == "on")
    ready, stop = threading.Event(), threading.Event()
    reader = threading.Thread(target=_drain, daemon=True,
                              args=(ev.EventReceiver(exchange, **broker), ready, stop))
    reader.start()
    ready.wait(30)
    try:
        return _run(shape, size, exchange, "on", broker, events=True)
    finally:
        stop.set()
        reader.join(30)


def _measure(args: argparse.Namespace, broker: dict[str, Any]) -> dict[str, Any]:
    exchange = f"events-cost-{uuid.uuid4().hex[:8]}"
    # One worker per setting, each on its own topic, both serving throughout.
    workers = [Worker(exchange, topic, [Noop], threads_count=args.threads, events=topic == "on",
                      **broker) for topic in ("off", "on")]
    threads = [threading.Thread(target=w.run, kwargs={"display_banner": False}, daemon=True)
               for w in workers]
    for thread, worker in zip(threads, workers):
        thread.start()
        worker.wait(30)
    shapes = (("unordered", args.tasks), ("linear", args.linear))
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for mode in MODES:  # warm up imports, connections and caches
            _timed(mode, "unordered", args.linear, exchange, broker)
        for _ in range(args.repeat):
            for shape, size in shapes:
                for mode in MODES:  # alternating, so that drift hits every mode alike
                    times.setdefault((mode, shape), []).append(
                        _timed(mode, shape, size, exchange, broker))
    finally:
        for worker in workers:
            worker.stop(grace=5)
        for thread in threads:
            thread.join(10)
    result: dict[str, Any] = {}
    for shape, size in shapes:
        base = statistics.median(times[("off", shape)])
        result[shape] = {"tasks": size}
        for mode in MODES:
            median = statistics.median(times[(mode, shape)])
            result[shape][mode] = {"run_s": median, "tasks_per_s": size / median,
                                   "ratio": median / base}
    publisher = ev.EventPublisher(exchange, **broker)
    result["events_published"] = publisher.published
    result["events_dropped"] = publisher.dropped
    return result


def _emit_away(emits: int) -> dict[str, Any]:
    """Microseconds per emit to a broker that refuses connections (a closed local port)."""
    publisher = ev.EventPublisher(f"events-away-{uuid.uuid4().hex[:8]}",
                                  url="redis://127.0.0.1:1/0", maxsize=100)
    started = time.perf_counter()
    for n in range(emits):
        publisher.emit("task-sent", n=n)
    spent = time.perf_counter() - started
    return {"emits": emits, "us_per_emit": spent * 1e6 / emits, "dropped": publisher.dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="unordered flow size")
    parser.add_argument("--linear", type=int, default=50, help="linear flow size")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--transport", default="memory", choices=["memory", "flowengine-fs"])
    parser.add_argument("--url", default=None, help="a broker URL instead of --transport")
    parser.add_argument("--away-emits", type=int, default=10_000,
                        help="emits timed while the broker is unreachable")
    args = parser.parse_args()
    broker = _broker(args)
    report = {
        "benchmark": "events_cost",
        "transport": mask_url(args.url) if args.url else args.transport,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        **_measure(args, broker),
        "emit_away": _emit_away(args.away_emits),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
