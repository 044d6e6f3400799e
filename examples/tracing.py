"""One trace from a service's request to every remote task, printed as a tree.

1. Starts two ``flowengine worker`` processes over the ``flowengine-fs`` transport (no broker
   needed). Each one sets up the OpenTelemetry SDK when it imports ``tracing_setup`` (one of its
   task modules) and writes its spans to a file.
2. This process, the "service", sets up the SDK too and runs an order flow on the workers
   inside its own ``POST /orders`` span: the engine's ``flow`` span is that span's child.
3. Stops the workers (they flush their spans as they exit), reads every process's file and
   prints the trace: the request, the flow, each atom, the request attempt the engine sent
   (``send``) and the worker's run of it (``run``), one trace id throughout.

Run: python examples/tracing.py
"""

from __future__ import annotations

import os

import tracing_setup
from opentelemetry import trace
from wbe_linear import build_flow  # the order flow of wbe_linear.py: reserve, charge, ship
from worker_processes import listening_executor, report_exit, worker_processes

from flowengine import engines

EXCHANGE = "tracing"
TOPIC = "orders"
WORKER_NAMES = ("worker-1", "worker-2")


def main() -> None:
    with listening_executor(EXCHANGE, TOPIC, prefix="flowengine-tracing-") as (executor, queues):
        spans = queues.parent / "spans"
        spans.mkdir()
        os.environ[tracing_setup.SPANS_ENV] = str(spans)  # inherited by the workers
        provider = tracing_setup.export_spans(spans, "service")
        tracer = trace.get_tracer("example-service")
        with worker_processes(WORKER_NAMES, executor, EXCHANGE, TOPIC,
                              ["wbe_tasks", "tracing_setup"], queues,
                              on_exit=report_exit) as workers:
            print("started " + ", ".join(f"{w.name} (pid {w.process.pid})" for w in workers))
            with tracer.start_as_current_span("POST /orders"):
                engine = engines.load(
                    build_flow(), engine="worker-based", executor=executor,
                    store={"item": "widget", "quantity": 2, "unit_price": 9.99},
                )  # fmt: skip
                engine.run()
            print(f"flow state: {engine.storage.get_flow_state()}")
        provider.shutdown()  # writes what the batch still holds
        written = tracing_setup.read_spans(spans)
        print(f"{len(written)} spans from {len(list(spans.glob('*.jsonl')))} processes")
        tracing_setup.print_trace_tree(written)


if __name__ == "__main__":
    main()
