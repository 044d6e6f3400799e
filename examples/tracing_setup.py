"""OpenTelemetry set-up for ``tracing.py``: the SDK in each process, spans to a file, the tree.

flowengine needs only the OpenTelemetry API (``pip install 'flowengine[otel]'``); the SDK and
the exporter are the application's choice. Here every process (the service running the engine
and each worker) writes its spans as JSON lines to a file of its own in one folder, and the
example reads them back to print one trace tree. In production you would send them to an OTLP
collector instead (see doc/tracing.rst).

A worker process imports this module because it is one of its task modules
(``flowengine worker --task wbe_tasks --task tracing_setup``): task modules are imported before
the worker serves anything, which makes them the place for a process's tracing set-up. Holding
no task class, it adds nothing the worker runs.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from worker_processes import WORKER_NAME_ENV

#: The folder every process writes its span file to (set by tracing.py for its workers).
SPANS_ENV = "EXAMPLE_SPANS_DIR"


def _line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def export_spans(folder: Path, service: str) -> TracerProvider:
    """Make the SDK this process's tracer provider, batching spans to ``folder/<pid>.jsonl``.

    The provider flushes what is left when the process exits (or on ``shutdown()``).
    """
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    out = open(folder / f"{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=out,
                                                                       formatter=_line)))
    trace.set_tracer_provider(provider)
    return provider


def read_spans(folder: Path) -> list[dict[str, Any]]:
    """Every span the processes wrote to ``folder``."""
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines() if line]


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _describe(span: dict[str, Any]) -> str:
    attributes = span["attributes"]
    took = (_when(span["end_time"]) - _when(span["start_time"])).total_seconds() * 1000
    parts = [span["name"], f"[{span['resource']['attributes']['service.name']}]",
             f"{took:.1f} ms"]
    for key, label in (("flowengine.conductor", "conductor"),
                       ("flowengine.request.attempt", "attempt"),
                       ("flowengine.outcome", "outcome"),
                       ("flowengine.retry.decision", "decision")):
        if key in attributes:
            parts.append(f"{label}={attributes[key]}")
    queued = attributes.get("flowengine.request.queue_time")
    if queued is not None:
        parts.append(f"queued={queued * 1000:.1f} ms")
    if span["links"]:
        parts.append(f"(linked to {len(span['links'])} earlier span)")
    return " ".join(parts)


def print_trace_tree(spans: list[dict[str, Any]]) -> None:
    """Print each trace as an indented tree of its spans, children in start order."""
    ids = {span["context"]["span_id"] for span in spans}
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for span in sorted(spans, key=lambda s: s["start_time"]):
        parent = span["parent_id"] if span["parent_id"] in ids else None
        children[parent].append(span)

    def show(span: dict[str, Any], depth: int) -> None:
        print("  " * depth + _describe(span))
        for child in children[span["context"]["span_id"]]:
            show(child, depth + 1)

    for root in children[None]:
        services = {s["resource"]["attributes"]["service.name"] for s in spans
                    if s["context"]["trace_id"] == root["context"]["trace_id"]}
        print(f"trace {root['context']['trace_id'][2:]} "
              f"({len(services)} processes: {', '.join(sorted(services))})")
        show(root, 1)


if os.environ.get(SPANS_ENV):
    export_spans(Path(os.environ[SPANS_ENV]), os.environ.get(WORKER_NAME_ENV, "worker"))
