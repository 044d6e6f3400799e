"""Flow factories the conductor tests post as jobs (imported by name by the conductors).

Tasks record each execution in a ledger file (``store["ledger"]``), so tests, and the fault
tests' separate processes, can count how often each atom ran: flowengine.testing's
:class:`~flowengine.testing.ledger.FileLedger`, one ``call`` line per execution (or revert)
once its step is done, with ``host:pid`` as the worker; the test kit's queries and assertions
read it. A task can wait for a file to appear (``store["gate"]``), so a test decides when the
flow goes on.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from flowengine import exceptions as exc
from flowengine import task
from flowengine.flows import linear_flow
from flowengine.testing import ledger as lg

#: What a revert's entry is called in :func:`ledger_entries` (``revert:step-1``).
REVERT = "revert:"

_ledgers: dict[str, lg.FileLedger] = {}


def kit_ledger(ledger: str | Path) -> lg.FileLedger:
    """This process's handle on the ledger file (one per file, so each reads only what was
    added since)."""
    path = str(ledger)
    found = _ledgers.get(path)
    if found is None:
        found = _ledgers.setdefault(path, lg.FileLedger(path))
    return found


def _record(ledger: str | None, name: str, action: str = "execute") -> None:
    if ledger:
        kit_ledger(ledger).append(lg.CALL, atom=name, action=action,
                                  worker=f"{socket.gethostname()}:{os.getpid()}")


def _named(entry: lg.Entry) -> tuple[str, int]:
    shown = f"{REVERT}{entry.atom}" if entry.action == "revert" else str(entry.atom)
    return shown, int(str(entry.worker).rpartition(":")[2])


def ledger_entries(ledger: Path) -> list[tuple[str, int]]:
    """``(task name, pid)`` of each execution, in order (a revert as ``revert:<name>``)."""
    if not ledger.exists():
        return []
    return [_named(e) for e in kit_ledger(ledger).calls()]


def recorded_at(ledger: Path, name: str, pid: int) -> float:
    """When (epoch seconds) process ``pid`` recorded its execution of ``name``."""
    for entry in kit_ledger(ledger).calls():
        if _named(entry) == (name, pid):
            return entry.t
    raise AssertionError(f"{name} was not recorded by process {pid}")


def ledger_lines(ledger: Path) -> list[str]:
    """The names of the tasks executed, in order."""
    return [name for name, _ in ledger_entries(ledger)]


def wait_for_file(path: Path, timeout: float = 20.0) -> None:
    """Block until ``path`` exists (written by another thread or process)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.01)


class Step(task.Task):
    """Records itself; when it is the gated step, it first writes ``<gate>.waiting`` and waits
    for the file ``gate``."""

    def execute(self, ledger: str | None = None, gate: str | None = None,
                gated_step: str | None = None, hold: float = 0.0) -> str:
        if gate and gated_step == self.name:
            Path(f"{gate}.waiting").touch()
            while not Path(gate).exists():
                time.sleep(0.02)  # a file written by another process: nothing to wait on
        if hold:
            threading.Event().wait(hold)  # simulates work that takes this long
        _record(ledger, self.name)
        return self.name


class UndoableStep(Step):
    """A :class:`Step` whose revert is recorded too, as ``revert:<name>``."""

    def revert(self, ledger: str | None = None, **kwargs: Any) -> None:
        _record(ledger, self.name, action="revert")


class Crash(task.Task):
    """Kills its whole process (a conductor that crashes on this job every time)."""

    def execute(self, ledger: str | None = None) -> None:
        _record(ledger, self.name)
        os._exit(17)


class Broken(task.Task):
    """Fails with an ordinary error."""

    def execute(self) -> None:
        raise ValueError("broken on purpose")


class Unreachable(task.Task):
    """Fails as if its executor were unreachable (an ExecutionFailure: abandoned)."""

    def execute(self) -> None:
        raise exc.ExecutionFailure("executor unreachable on purpose")


class Secretive(task.Task):
    """Takes a password (declared secret), and fails saying so."""

    secret_args = ("password",)

    def execute(self, password: str) -> None:
        raise ValueError(f"refused {password}")


def steps(count: int = 3) -> Any:
    """``count`` steps in a line: step-1 ... step-N."""
    return linear_flow.Flow("steps").add(
        *(Step(f"step-{i}") for i in range(1, count + 1)))


def undoable_steps(count: int = 3) -> Any:
    """``count`` :class:`UndoableStep` in a line: step-1 ... step-N."""
    return linear_flow.Flow("undoable-steps").add(
        *(UndoableStep(f"step-{i}") for i in range(1, count + 1)))


def crashing() -> Any:
    """A step, then a crash."""
    return linear_flow.Flow("crashing").add(Step("before"), Crash("crash"))


def broken() -> Any:
    """An ordinary failure."""
    return linear_flow.Flow("broken").add(Broken("broken"))


def unreachable() -> Any:
    """An execution failure."""
    return linear_flow.Flow("unreachable").add(Unreachable("unreachable"))


def secretive() -> Any:
    """A task whose failure names its password."""
    return linear_flow.Flow("secretive").add(Secretive("secretive"))


class Sized(task.Task):
    """Needs ``volume_size``, which nothing in its flow provides."""

    def execute(self, volume_size: int) -> int:
        return volume_size


def needy() -> Any:
    """A flow that cannot start without ``volume_size`` in its store."""
    return linear_flow.Flow("needy").add(Sized("sized"))


def reverting() -> Any:
    """A step, then an ordinary failure: the flow is reverted."""
    return linear_flow.Flow("reverting").add(Step("step-1"), Broken("broken"))
