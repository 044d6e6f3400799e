"""Flows the lock tests post as jobs, and the execution ledger they write.

Each step appends ``start <job> <step> <pid> <time>`` before its work and
``end <job> <step> <pid> <time>`` after it to the ledger file (``store["ledger"]``), so a test
reads, across processes, when each job ran where. A step can wait for a file first
(``store["gate"]``, written ``<gate>.waiting`` while it waits), so a test decides when a job
goes on.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

from flowengine import task
from flowengine.flows import linear_flow


def _record(ledger: str, event: str, job: str, step: str) -> None:
    with open(ledger, "a", encoding="utf-8") as out:
        out.write(f"{event} {job} {step} {os.getpid()} {time.time()}\n")
        out.flush()
        os.fsync(out.fileno())


class Hold(task.Task):
    """Records its start, waits for the gate if it is the gated step, works ``hold`` seconds,
    records its end."""

    def execute(self, ledger: str, job: str, hold: float = 0.0, gate: str | None = None,
                gated_step: str | None = None) -> str:
        _record(ledger, "start", job, self.name)
        if gate and gated_step == self.name:
            Path(f"{gate}.waiting").touch()
            while not Path(gate).exists():
                time.sleep(0.02)  # a file written by another process: nothing to wait on
        if hold:
            threading.Event().wait(hold)  # work that takes this long
        _record(ledger, "end", job, self.name)
        return self.name


def held(steps: int = 2) -> Any:
    """``steps`` :class:`Hold` steps in a line: hold-1 ... hold-N."""
    return linear_flow.Flow("held").add(*(Hold(f"hold-{i}") for i in range(1, steps + 1)))


@dataclasses.dataclass(frozen=True)
class Line:
    """One ledger line."""

    event: str
    job: str
    step: str
    pid: int
    at: float


def lines(ledger: Path) -> list[Line]:
    """The ledger's lines, in the order written."""
    if not ledger.exists():
        return []
    found = []
    for text in ledger.read_text().splitlines():
        if text.strip():
            event, job, step, pid, at = text.split()
            found.append(Line(event, job, step, int(pid), float(at)))
    return found


def intervals(ledger: Path) -> dict[str, tuple[float, float]]:
    """Each job's first start and last end."""
    spans: dict[str, tuple[float, float]] = {}
    for line in lines(ledger):
        start, end = spans.get(line.job, (line.at, line.at))
        spans[line.job] = (min(start, line.at), max(end, line.at))
    return spans
