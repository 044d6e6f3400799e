"""Report how many programs the conformance harness compared with TaskFlow, and how many of
TaskFlow's own unit tests passed."""

from __future__ import annotations

from typing import Any

from . import compared


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if compared.PROGRAMS:
        terminalreporter.write_line(
            f"conformance: {len(compared.PROGRAMS)} generated programs compared with TaskFlow")
    for line in compared.UNIT_COUNTS:
        terminalreporter.write_line(f"conformance: TaskFlow unit tests on flowengine, {line}")
