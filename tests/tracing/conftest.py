"""Fixtures of the tracing tests: an OpenTelemetry SDK provider with an in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from span_capture import captured_spans  # tests/ is on sys.path (rootdir conftest)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Spans ended during the test (tracing is on for this test only)."""
    yield from captured_spans(monkeypatch)
