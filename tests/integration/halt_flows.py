"""Flows for the lost-database tests, imported by name (``halt_flows:steps``) by the
``flowengine run`` and ``flowengine conductor`` processes those tests start.

Each step writes ``execute <name>`` or ``revert <name>`` to a ledger file (``store["ledger"]``),
so a test can see what ran and what was undone across processes; the step named by
``store["gated_step"]`` first writes ``<gate>.waiting`` and waits for the file ``gate``, so the
test decides when it ends (after taking the database away).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from flowengine import task
from flowengine.flows import linear_flow


def _record(ledger: str, line: str) -> None:
    with open(ledger, "a", encoding="utf-8") as out:
        out.write(f"{line}\n")
        out.flush()
        os.fsync(out.fileno())


def ledger(path: Path) -> list[str]:
    """The ledger's lines, in order."""
    return path.read_text().splitlines() if path.exists() else []


class Step(task.Task):
    """Records its execute and its revert; the gated step waits for its gate first."""

    def execute(self, ledger: str, gate: str = "", gated_step: str = "") -> str:
        if gate and gated_step == self.name and not Path(gate).exists():
            Path(f"{gate}.waiting").touch()
            while not Path(gate).exists():
                time.sleep(0.02)  # a file another process writes: nothing to wait on
        _record(ledger, f"execute {self.name}")
        return self.name

    def revert(self, ledger: str, **kwargs: Any) -> None:
        _record(ledger, f"revert {self.name}")


def steps(count: int = 4) -> linear_flow.Flow:
    """``count`` steps in a line: step-1 ... step-N."""
    return linear_flow.Flow("steps").add(*(Step(f"step-{i}") for i in range(1, count + 1)))
