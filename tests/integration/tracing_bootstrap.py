"""Imported by worker processes (``--task tracing_bootstrap``): the OpenTelemetry SDK, set up to
append this process's spans to ``<TRACING_SPANS_DIR>/<pid>.jsonl`` as they end.

A worker's task modules are imported before it serves anything, which makes one of them the
place for a process's tracing setup. The module holds no task class.
"""

from __future__ import annotations

import os
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

#: Environment variable naming the folder of the span files.
SPANS_ENV = "TRACING_SPANS_DIR"


def json_line(span: ReadableSpan) -> str:
    """One span as a line of JSON."""
    return span.to_json(indent=None) + "\n"


def export_to(folder: Path, service: str) -> TracerProvider:
    """Install a provider writing every ended span to ``folder/<pid>.jsonl`` at once."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    out = open(folder / f"{os.getpid()}.jsonl", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out,
                                                                        formatter=json_line)))
    trace.set_tracer_provider(provider)
    return provider


if os.environ.get(SPANS_ENV):
    export_to(Path(os.environ[SPANS_ENV]), f"worker-{os.getpid()}")
