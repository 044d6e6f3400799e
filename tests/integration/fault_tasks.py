"""Tasks the fault-injection tests run on ``flowengine worker`` processes.

Every task writes what it does to a ledger the engine never touches: one JSON line per event
(``{"atom", "event", "pid", "t", ...}``), appended with a single ``O_APPEND`` write and
``fsync``'d before the task goes on, so a line written just before a SIGKILL is in the file
afterwards and lines of concurrent tasks never interleave. The ledger's path comes from
``FAULT_LEDGER``; tests count executions from it, never from the engine's own records.

Behaviour comes from the class and the request's arguments only (workers build a task from its
class and name), and each class is module-level so ``--task fault_tasks`` serves them all.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from flowengine import task

#: Environment of worker processes: the ledger file, the gate directory, the "cured" marker.
LEDGER_ENV = "FAULT_LEDGER"
GATES_ENV = "FAULT_GATES"
CURED_ENV = "FAULT_CURED"

EXECUTE_START = "execute-start"
EXECUTE_END = "execute-end"
REVERT_START = "revert-start"
REVERT_END = "revert-end"

#: Seconds a gated task waits for its gate before it gives up (a test that failed never opens it).
GATE_TIMEOUT = 120.0
#: Seconds between looks at the gate directory.
GATE_POLL = 0.01


def record(atom: str, event: str, durable: bool = True, **data: Any) -> None:
    """Append one event to the ledger; ``durable`` makes it survive more than a process crash."""
    line = json.dumps({"atom": atom, "event": event, "pid": os.getpid(), "t": time.time(),
                       **data}) + "\n"
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def gate_path(atom: str, pid: int | None = None) -> Path:
    """The file that lets ``atom`` finish (in every process, or only in ``pid``)."""
    name = atom if pid is None else f"{atom}.{pid}"
    return Path(os.environ[GATES_ENV]) / name


class _Recorded(task.Task):
    """Records its revert, so tests see what was undone and where."""

    def revert(self, *args: Any, **kwargs: Any) -> None:
        record(self.name, REVERT_START)
        record(self.name, REVERT_END)


class Step(_Recorded):
    """Returns its own name at once."""

    def execute(self) -> str:
        record(self.name, EXECUTE_START)
        record(self.name, EXECUTE_END)
        return self.name


class Use(_Recorded):
    """Returns (and records) the value it is given: shows which result the engine applied."""

    def execute(self, value: Any) -> Any:
        record(self.name, EXECUTE_START, value=value)
        record(self.name, EXECUTE_END, value=value)
        return value


class Gate(_Recorded):
    """Blocks until its gate file appears; returns ``{"atom", "pid"}`` of the process it ran in."""

    def execute(self) -> dict[str, Any]:
        record(self.name, EXECUTE_START)
        shared, mine = gate_path(self.name), gate_path(self.name, os.getpid())
        deadline = time.monotonic() + GATE_TIMEOUT
        while not (shared.exists() or mine.exists()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate of task {self.name!r} never opened")
            time.sleep(GATE_POLL)
        record(self.name, EXECUTE_END)
        return {"atom": self.name, "pid": os.getpid()}


class FailsFirst(_Recorded):
    """Fails the first attempt of its retry controller (``attempt`` 1); returns the attempt."""

    def execute(self, attempt: int) -> dict[str, Any]:
        record(self.name, EXECUTE_START, attempt=attempt)
        record(self.name, EXECUTE_END, attempt=attempt)
        if attempt == 1:
            raise RuntimeError("the first attempt fails")
        return {"attempt": attempt, "pid": os.getpid()}


class Slow(_Recorded):
    """Works for ``seconds`` (default 1) and returns them."""

    def execute(self, seconds: float = 1.0) -> float:
        record(self.name, EXECUTE_START)
        time.sleep(seconds)
        record(self.name, EXECUTE_END)
        return seconds


class KillsItsWorker(_Recorded):
    """SIGKILLs the worker process it runs in, unless the ``FAULT_CURED`` file exists."""

    def execute(self) -> str:
        record(self.name, EXECUTE_START)
        cured = os.environ.get(CURED_ENV)
        if not (cured and os.path.exists(cured)):
            os.kill(os.getpid(), signal.SIGKILL)
        record(self.name, EXECUTE_END)
        return "cured"


class Noop(task.Task):
    """Records its ``n`` (no fsync: nothing kills these workers) and returns it."""

    def execute(self, n: int) -> int:
        record(self.name, EXECUTE_END, durable=False, n=n)
        return n
