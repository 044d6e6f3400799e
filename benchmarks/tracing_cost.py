"""What tracing costs: the same runs with the OpenTelemetry API absent, present but unused, and on.

Modes, taking turns so that drift hits all alike (the median of ``--repeat`` runs is reported):

- ``absent``: ``opentelemetry.trace`` not imported (as with the API not installed);
- ``no_provider``: the API imported, no tracer provider set (instrumentation off);
- ``not_sampled``: the SDK's provider with the ``always_off`` sampler (spans made, not recorded);
- ``on``: the SDK's provider recording every span, exported in batches to an exporter that drops
  them (what an application pays before its exporter's own cost).

Workloads: a serial engine running a linear flow of ``--serial`` no-op tasks (engine overhead
only, the worst case for a per-atom cost) and a worker-based engine running an unordered flow of
``--remote`` no-op tasks on an in-process worker over kombu's memory transport (adds the producer
and consumer spans and the header propagation). Each mode reports seconds, tasks/s, ``ratio``
(mode time / ``absent`` time; 1.05 means 5% slower) and spans made per task. The hooks' cost when
off is also timed directly, in nanoseconds per call, and so is the SDK's own cost of one span
(``sdk_span_alone``, microseconds): the floor of what recording costs per atom.

Example::

    python benchmarks/tracing_cost.py --serial 300 --remote 200 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
import timeit
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from flowengine import engines, task, tracing
from flowengine.flows import linear_flow, unordered_flow
from flowengine.worker_based.worker import Worker

MODES = ("absent", "no_provider", "not_sampled", "on")
TOPIC = "tracing-cost"


class Noop(task.Task):
    def execute(self) -> None:
        return None


class Dropping(SpanExporter):
    """Counts spans and throws them away."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class Modes:
    """Puts the process in one mode at a time."""

    def __init__(self) -> None:
        self.exporter = Dropping()
        self.recording = TracerProvider()
        self.processor = BatchSpanProcessor(self.exporter)
        self.recording.add_span_processor(self.processor)
        self.unsampled = TracerProvider(sampler=ALWAYS_OFF)
        self._api = sys.modules["opentelemetry.trace"]

    def enter(self, mode: str) -> None:
        sys.modules["opentelemetry.trace"] = self._api
        # The API sets its global provider once per process; the benchmark swaps it directly.
        trace._TRACER_PROVIDER = {"on": self.recording,  # type: ignore[attr-defined]
                                  "not_sampled": self.unsampled}.get(mode)
        if mode == "absent":
            del sys.modules["opentelemetry.trace"]

    def leave(self) -> None:
        sys.modules["opentelemetry.trace"] = self._api
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]

    def spans(self) -> int:
        self.processor.force_flush()
        return self.exporter.spans


def _serial(size: int) -> float:
    engine = engines.load(linear_flow.Flow("serial").add(*[Noop(f"t{i}") for i in range(size)]))
    engine.prepare()
    started = time.perf_counter()
    engine.run()
    return time.perf_counter() - started


def _remote(size: int, exchange: str) -> float:
    flow = unordered_flow.Flow("remote").add(*[Noop(f"t{i}") for i in range(size)])
    engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                          transport="memory", events=False)
    engine.prepare()
    started = time.perf_counter()
    engine.run()
    return time.perf_counter() - started


def _measure(modes: Modes, runs: dict[str, Callable[[], float]], sizes: dict[str, int],
             repeat: int) -> dict[str, Any]:
    times: dict[tuple[str, str], list[float]] = {}
    spans: dict[tuple[str, str], int] = {}
    for run in runs.values():
        for mode in MODES:  # warm up imports, connections and caches
            modes.enter(mode)
            try:
                run()
            finally:
                modes.leave()
    for _ in range(repeat):
        for workload, run in runs.items():
            for mode in MODES:
                before = modes.spans()
                modes.enter(mode)
                try:
                    times.setdefault((workload, mode), []).append(run())
                finally:
                    modes.leave()
                spans[(workload, mode)] = spans.get((workload, mode), 0) + (
                    modes.spans() - before)
    result: dict[str, Any] = {}
    for workload in runs:
        size = sizes[workload]
        base = statistics.median(times[(workload, "absent")])
        result[workload] = {"tasks": size}
        for mode in MODES:
            median = statistics.median(times[(workload, mode)])
            result[workload][mode] = {
                "run_s": median, "tasks_per_s": size / median, "ratio": median / base,
                "spans_per_task": spans[(workload, mode)] / (size * repeat)}
    return result


def _hooks_off(modes: Modes, calls: int) -> dict[str, float]:
    """Nanoseconds per call of the hooks the engine and worker call, with tracing off."""
    engine = engines.load(Noop("t"))
    noop = Noop("t")
    headers: dict[str, Any] = {}
    hooks: dict[str, Callable[[], object]] = {
        "flow_run": lambda: tracing.flow_run(engine),
        "task_scope": lambda: tracing.task_scope(noop),
        "request_sent": lambda: tracing.request_sent(
            headers, "atom", request_id="r", attempt=1, task_name="t", topic="q"),
        "serving": lambda: tracing.serving(headers, task_name="t", worker="w"),
        "replied": lambda: tracing.replied("SUCCESS"),
    }
    result = {}
    for mode in ("absent", "no_provider"):
        modes.enter(mode)
        try:
            for name, hook in hooks.items():
                seconds = min(timeit.repeat(hook, number=calls, repeat=3))
                result[f"{name}_{mode}_ns"] = seconds / calls * 1e9
        finally:
            modes.leave()
    return result


def _sdk_span(modes: Modes, calls: int) -> dict[str, float]:
    """Microseconds the SDK itself takes to start and end one span (the floor of ``on``)."""
    result = {}
    for mode in ("not_sampled", "on"):
        modes.enter(mode)
        try:
            tracer = trace.get_tracer("tracing-cost")
            attributes = {"flowengine.atom.name": "t", "flowengine.atom.kind": "task"}
            seconds = min(timeit.repeat(
                lambda: tracer.start_span("execute t", attributes=attributes).end(),  # noqa: B023
                number=calls, repeat=3))
            result[f"{mode}_us"] = seconds / calls * 1e6
        finally:
            modes.leave()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", type=int, default=300, help="serial linear flow size")
    parser.add_argument("--remote", type=int, default=200, help="worker-based flow size")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8, help="the worker's task threads")
    parser.add_argument("--hook-calls", type=int, default=100_000)
    args = parser.parse_args()
    exchange = f"tracing-cost-{uuid.uuid4().hex[:8]}"
    worker = Worker(exchange, TOPIC, [Noop], threads_count=args.threads, transport="memory",
                    events=False)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    worker.wait(30)
    modes = Modes()
    try:
        runs = {"serial": lambda: _serial(args.serial),
                "worker_based": lambda: _remote(args.remote, exchange)}
        measured = _measure(modes, runs, {"serial": args.serial, "worker_based": args.remote},
                            args.repeat)
        hooks = _hooks_off(modes, args.hook_calls)
        sdk = _sdk_span(modes, max(args.hook_calls // 20, 10))
    finally:
        worker.stop(grace=5)
        thread.join(10)
    report = {"benchmark": "tracing_cost", "python": platform.python_version(),
              "cpus": os.cpu_count(), "repeat": args.repeat, **measured, "hooks_off": hooks,
              "sdk_span_alone": sdk}
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
