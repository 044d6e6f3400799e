"""Flows the cancel, deadline and repair stories run, in worker, conductor and CLI processes.

Every task writes what it does to a ledger the engine never touches: one JSON line per event
(``{"atom", "event", "t", "pid", ...}``), appended with one ``O_APPEND`` write, in the file
``$STOPPING_LEDGER``. Importable by name from every process the tests start (``tests/`` is on
their ``PYTHONPATH``); behaviour comes from the class and the arguments only.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from flowengine import context, task
from flowengine.flows import linear_flow

#: The environment variable naming the ledger file.
LEDGER_ENV = "STOPPING_LEDGER"
#: Seconds a task waiting to be cancelled waits at most (a test that failed never cancels).
PATIENCE = 120.0


def record(atom: str, event: str, **data: Any) -> None:
    """Append one event to the ledger."""
    line = json.dumps({"atom": atom, "event": event, "t": time.time(), "pid": os.getpid(),
                       **data}) + "\n"
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every event of the ledger at ``path``, oldest first (complete lines only)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


class Step(task.Task):
    """Returns its name; its revert is recorded (with the result it was given)."""

    def execute(self) -> str:
        record(self.name, "execute")
        return self.name

    def revert(self, result: Any = None, **kwargs: Any) -> None:
        record(self.name, "revert", result=result if not hasattr(result, "check") else None)


class LoopsUntilCancelled(Step):
    """Polls its context until its flow is cancelled, then records when and why, and returns."""

    def execute(self) -> str:
        ctx = context.current()
        record(self.name, "execute", worker=ctx.worker)
        deadline = time.monotonic() + PATIENCE
        while not ctx.cancel_requested:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} was never cancelled")
            time.sleep(0.01)  # the task's own work between two looks
        record(self.name, "stopped", reason=ctx.cancel_reason)
        return self.name


class AsyncLoopsUntilCancelled(Step):
    """Awaits short sleeps until its flow's cancel interrupts one; records that, and lets the
    cancellation go on."""

    async def execute(self) -> str:  # type: ignore[override]
        record(self.name, "execute")
        try:
            deadline = time.monotonic() + PATIENCE
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            record(self.name, "stopped", reason=context.current().cancel_reason)
            raise
        raise TimeoutError(f"{self.name} was never interrupted")


class RevertFailsWhile(Step):
    """Returns ``<name>-resource``; its revert fails while the file ``fault`` exists."""

    def execute(self, fault: str) -> str:
        record(self.name, "execute")
        return f"{self.name}-resource"

    def revert(self, fault: str, result: Any = None, **kwargs: Any) -> None:
        if os.path.exists(fault):
            record(self.name, "revert-failed")
            raise RuntimeError(f"{self.name} cannot be undone while {fault} exists")
        record(self.name, "revert", result=result)


class Fail(Step):
    """Always fails."""

    def execute(self) -> None:
        record(self.name, "execute")
        raise RuntimeError(f"{self.name} failed")


def five(middle: str = "loops") -> linear_flow.Flow:
    """s1, s2, then s3 (running until its flow is cancelled), then s4 and s5."""
    third = (AsyncLoopsUntilCancelled if middle == "async" else LoopsUntilCancelled)("s3")
    return linear_flow.Flow("five").add(Step("s1"), Step("s2"), third, Step("s4"), Step("s5"))


def revert_fault(fault: str) -> linear_flow.Flow:
    """A runs, B's revert fails while ``fault`` exists, C fails: FAILURE until repaired."""
    return linear_flow.Flow("revert-fault").add(
        Step("A"), RevertFailsWhile("B", inject={"fault": fault}), Fail("C"))
