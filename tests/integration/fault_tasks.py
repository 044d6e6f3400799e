"""Tasks the fault-injection tests run on ``flowengine worker`` processes.

Every task writes what it does to a ledger the engine never touches: flowengine.testing's
:class:`~flowengine.testing.ledger.FileLedger`, the ledger ``flowengine rehearse`` shares with
its worker processes (JSON lines appended under an exclusive lock, each written whole before the
task goes on, so a line written just before a SIGKILL is in the file afterwards). A task's
``execute`` or ``revert`` is a ``call`` line when it starts and a ``return`` line when it ends,
with the atom, the action, ``host:pid`` as the worker, and what else the task says as details.
The ledger's path comes from ``FAULT_LEDGER``; tests count executions from it, never from the
engine's own records (``fault_support.Ledger`` reads it).

Behaviour comes from the class and the request's arguments only (workers build a task from its
class and name), and each class is module-level so ``--task fault_tasks`` serves them all.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from flowengine import task
from flowengine.testing import ledger as lg

#: Environment of worker processes: the ledger file, the gate directory, the "cured" marker.
LEDGER_ENV = "FAULT_LEDGER"
GATES_ENV = "FAULT_GATES"
CURED_ENV = "FAULT_CURED"

EXECUTE_START = "execute-start"
EXECUTE_END = "execute-end"
REVERT_START = "revert-start"
REVERT_END = "revert-end"

#: The ledger line kind and action of each event.
LINES = {EXECUTE_START: (lg.CALL, "execute"), EXECUTE_END: (lg.RETURN, "execute"),
         REVERT_START: (lg.CALL, "revert"), REVERT_END: (lg.RETURN, "revert")}

#: Seconds a gated task waits for its gate before it gives up (a test that failed never opens it).
GATE_TIMEOUT = 120.0
#: Seconds between looks at the gate directory.
GATE_POLL = 0.01

_ledgers: dict[str, lg.FileLedger] = {}


def ledger() -> lg.FileLedger:
    """This process's handle on the ledger ``FAULT_LEDGER`` names (one per process, so each
    reads only what was added since its last line)."""
    path = os.environ[LEDGER_ENV]
    found = _ledgers.get(path)
    if found is None:
        found = _ledgers.setdefault(path, lg.FileLedger(path))
    return found


def record(atom: str, event: str, **details: Any) -> None:
    """Append one event to the ledger (``details``: what else the task says)."""
    kind, action = LINES[event]
    ledger().append(kind, atom=atom, action=action,
                    outcome=lg.RETURNED if kind == lg.RETURN else None,
                    worker=f"{socket.gethostname()}:{os.getpid()}", details=details)


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
    """Records its ``n`` and returns it."""

    def execute(self, n: int) -> int:
        record(self.name, EXECUTE_END, n=n)
        return n
