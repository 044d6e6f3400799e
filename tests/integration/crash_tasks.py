"""Tasks and the flow factory of the crash-and-resume tests (imported by the child processes).

Every task appends what it does to its own ledger: a file the engine never touches, one JSON line
per event (``{"atom", "event", "pid"}``; events ``execute-start``, ``execute-end``,
``revert-start``, ``revert-end``), written with one ``O_APPEND`` write and ``fsync``'d before the
task goes on. A line written before a SIGKILL is therefore in the file afterwards, and lines of
concurrent tasks never interleave.

A test that kills a child at a number of distinct actions started writes that number to the
ledger's hold file (:func:`hold_path`): a task about to start a further distinct action waits
there until the kill, so a child cannot run past its kill point however late the kill comes
(the kill still lands anywhere between that point and the next start: in an action, or after
one returned and before the engine stored it).

:func:`make_flow` is the factory the children hand to ``engines.load_from_factory``; its
arguments are JSON values, stored in the flow detail, so a resuming process rebuilds the same
flow with ``engines.load_from_detail``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from flowengine import task
from flowengine.flows import graph_flow, linear_flow

EXECUTE_START = "execute-start"
EXECUTE_END = "execute-end"
REVERT_START = "revert-start"
REVERT_END = "revert-end"
STARTS = (EXECUTE_START, REVERT_START)

#: Tasks per layer of the ``graph`` shape; each task requires every task of the layer before.
LAYER_WIDTH = 3


class Boom(RuntimeError):
    """What a task told to fail raises."""


def record(ledger: str, atom: str, event: str) -> None:
    """Append one event to the ledger and make it durable before returning."""
    line = json.dumps({"atom": atom, "event": event, "pid": os.getpid()}) + "\n"
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def hold_path(ledger: str) -> str:
    """The file naming how many distinct actions may start before tasks wait to be killed."""
    return ledger + ".hold"


def start(ledger: str, atom: str, event: str) -> None:
    """Record the start of an action, first waiting for the kill if the hold file says so."""
    try:
        with open(hold_path(ledger), encoding="utf-8") as f:
            limit = int(f.read())
    except FileNotFoundError:
        limit = None
    if limit is not None:
        action = event.split("-")[0]
        started = {(r["atom"], r["event"].split("-")[0]) for r in read_ledger(ledger)
                   if r["event"] in STARTS}
        if (atom, action) not in started and len(started) >= limit:
            threading.Event().wait()  # until the test's SIGKILL
    record(ledger, atom, event)


def read_ledger(ledger: str) -> list[dict[str, Any]]:
    """Every complete event in the ledger, oldest first."""
    try:
        with open(ledger, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    # A line is complete once its newline is there; the last one may still be on its way.
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


class LedgerTask(task.Task):
    """Adds one to the sum of its inputs; ``work`` seconds of (simulated) work per call.

    Args:
        name: the task's name; it provides ``name`` too.
        ledger: the ledger file.
        work: seconds each ``execute`` and ``revert`` takes.
        fail: raise :class:`Boom` from ``execute`` at once (without working).
        requires: names of the values this task adds up.
    """

    def __init__(self, name: str, ledger: str, work: float, fail: bool = False,
                 requires: list[str] | None = None) -> None:
        super().__init__(name=name, provides=name, requires=requires or [])
        self._ledger = ledger
        self._work = work
        self._fail = fail

    def execute(self, **inputs: int) -> int:
        start(self._ledger, self.name, EXECUTE_START)
        if self._fail:
            # At once, so that its siblings are still running when the flow starts reverting.
            record(self._ledger, self.name, EXECUTE_END)
            raise Boom(f"{self.name} failed on purpose")
        # The task's work: long enough for the test to SIGKILL the process while it is going on.
        time.sleep(self._work)
        record(self._ledger, self.name, EXECUTE_END)
        return 1 + sum(inputs.values())

    def revert(self, result: Any, flow_failures: Any, **inputs: int) -> None:
        start(self._ledger, self.name, REVERT_START)
        time.sleep(self._work)
        record(self._ledger, self.name, REVERT_END)


def task_names(shape: str, size: int) -> list[str]:
    """The names of the tasks :func:`make_flow` makes, in the order a serial engine runs them."""
    if shape == "linear":
        return [f"t{i:02d}" for i in range(size)]
    return [f"l{i // LAYER_WIDTH}t{i % LAYER_WIDTH}" for i in range(size)]


def make_flow(shape: str, size: int, ledger: str, work: float = 0.03,
              fail: str | None = None) -> Any:
    """Build the flow under test.

    Args:
        shape: ``linear`` (each task needs the one before) or ``graph`` (layers of
            :data:`LAYER_WIDTH` tasks, each needing every task of the layer before).
        size: how many tasks.
        ledger: the ledger file every task writes to.
        work: seconds each task call takes.
        fail: the name of a task that fails (the flow then reverts), or None.
    """
    names = task_names(shape, size)
    if shape == "linear":
        flow = linear_flow.Flow(f"crash-{shape}")
        tasks = [LedgerTask(name, ledger, work, fail=name == fail,
                            requires=[names[i - 1]] if i else None)
                 for i, name in enumerate(names)]
    elif shape == "graph":
        flow = graph_flow.Flow(f"crash-{shape}")
        tasks = []
        for i, name in enumerate(names):
            layer = i // LAYER_WIDTH
            before = names[(layer - 1) * LAYER_WIDTH:layer * LAYER_WIDTH] if layer else None
            tasks.append(LedgerTask(name, ledger, work, fail=name == fail, requires=before))
    else:
        raise ValueError(f"Unknown flow shape {shape!r} (expected 'linear' or 'graph')")
    return flow.add(*tasks)


def expected_results(shape: str, size: int) -> dict[str, int]:
    """What every task returns in a run that succeeds."""
    names = task_names(shape, size)
    values: dict[str, int] = {}
    for i, name in enumerate(names):
        if shape == "linear":
            inputs = [values[names[i - 1]]] if i else []
        else:
            layer = i // LAYER_WIDTH
            inputs = [values[n] for n in names[(layer - 1) * LAYER_WIDTH:layer * LAYER_WIDTH]]
        values[name] = 1 + sum(inputs)
    return values
