"""The async atoms of the behaviour suite: ``async def execute``/``revert``, importable by name.

Workers serve this module besides :mod:`.tasks`, so every class here follows its rules (module
level, built from its name alone, JSON results) and writes what it did to the same ledger.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, ClassVar

from flowengine import task
from flowengine.flows import unordered_flow as uf

from . import tasks


class AsyncStep(task.Task):
    """Awaits, then returns its name; its async revert records what it received."""

    async def execute(self) -> str:
        tasks.record("execute", self.name)
        await asyncio.sleep(0)
        return self.name

    async def revert(self, result: Any, flow_failures: Any, **kwargs: Any) -> str:
        await asyncio.sleep(0)
        tasks.record("revert", self.name, result=tasks._result_summary(result),
                     flow_failures=sorted(flow_failures))
        return f"{self.name} undone"


class AsyncAdd(AsyncStep):
    """Returns ``x + y``."""

    async def execute(self, x: int, y: int) -> int:  # type: ignore[override]
        tasks.record("execute", self.name, x=x, y=y)
        await asyncio.sleep(0)
        return x + y


class AsyncFail(AsyncStep):
    """Raises :class:`~.tasks.Boom` naming itself."""

    async def execute(self) -> str:
        tasks.record("execute", self.name)
        await asyncio.sleep(0)
        raise tasks.Boom(f"{self.name} failed")


class AsyncProgress(AsyncStep):
    """Reports progress 0.5 between two awaits."""

    async def execute(self) -> str:
        await asyncio.sleep(0)
        self.update_progress(0.5)
        await asyncio.sleep(0)
        return self.name


class AsyncFlaky(AsyncStep):
    """Fails its first two runs (counted in the ledger, which every process shares)."""

    async def execute(self) -> str:
        runs = tasks.names("execute").count(self.name)
        tasks.record("execute", self.name)
        await asyncio.sleep(0)
        if runs < 2:
            raise tasks.Boom("not yet")
        return "third time"


class AsyncBlocks(task.Task):
    """Never finishes by itself; records that it was cancelled."""

    time_limit = 0.3

    async def execute(self) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            tasks.record("cancelled", self.name)
            raise


class AsyncWait(task.Task):
    """Records that it started, then awaits ``seconds`` (cancellation is recorded)."""

    async def execute(self, seconds: float) -> str:
        tasks.record("started", self.name)
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            tasks.record("cancelled", self.name)
            raise
        return self.name


#: Seconds the gates of one meeting wait, all together, for the last of them to arrive.
MEETING_WAIT = 30.0


class Meeting:
    """The gates of one key: how many arrived, whether all did, and the one deadline (loop
    time) that every gate of it waits until."""

    def __init__(self, deadline: float) -> None:
        self.arrived = 0
        self.met = asyncio.Event()
        self.deadline = deadline


class Gate(task.Task):
    """Waits until ``parties`` gates given the same ``key`` are awaited at once, in one process
    (on one event loop): they finish only if all of them run at the same time.

    The gates of a meeting share one deadline, set by the first to arrive: when they cannot all
    run at once (an engine awaiting fewer than it should), the first gives up after
    :data:`MEETING_WAIT` seconds and each later one at once, so the flow fails in about that
    time instead of after ``parties`` times it.
    """

    meetings: ClassVar[dict[str, Meeting]] = {}

    async def execute(self, key: str, parties: int) -> str:
        loop = asyncio.get_running_loop()
        meeting = self.meetings.setdefault(key, Meeting(loop.time() + MEETING_WAIT))
        meeting.arrived += 1
        arrival = meeting.arrived
        if arrival == parties:
            meeting.met.set()
        try:
            await asyncio.wait_for(meeting.met.wait(), max(0.0, meeting.deadline - loop.time()))
        except TimeoutError:
            raise TimeoutError(f"gate {self.name!r} (arrived {arrival} of {parties}) gave up: "
                               f"the gates were not all awaited at once within "
                               f"{MEETING_WAIT:.0f}s") from None
        return self.name


def gates(parties: int) -> uf.Flow:
    """An unordered flow of ``parties`` gates that must all be awaited at once to finish."""
    key = uuid.uuid4().hex
    return uf.Flow("gates").add(*(Gate(f"gate{i}", inject={"key": key, "parties": parties})
                                  for i in range(parties)))


def wait_for_entry(event: str, atom: str, timeout: float = 10.0) -> bool:
    """Whether ``atom`` wrote ``event`` within ``timeout`` seconds (a worker process writes to
    a file nobody can wait on, so the ledger is looked at every few milliseconds)."""
    deadline = time.monotonic() + timeout
    while atom not in tasks.names(event):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class AsyncUntilCancelled(AsyncStep):
    """Meets the test at the barrier named ``barrier``, then awaits a long sleep that its
    flow's cancel interrupts; records that it was interrupted and lets the cancellation go on."""

    async def execute(self, barrier: str) -> str:  # type: ignore[override]
        tasks.record("execute", self.name)
        try:
            # The cancel may come while the barrier's thread hands control back.
            await asyncio.to_thread(tasks._barriers.get(barrier).wait)
            await asyncio.sleep(tasks.CANCEL_PATIENCE)
        except asyncio.CancelledError:
            tasks.record("interrupted", self.name)
            raise
        raise tasks.Boom(f"{self.name} was never interrupted")


class AsyncContextProbe(AsyncStep):
    """Records its context from inside an awaited ``execute``, after an await."""

    async def execute(self) -> str:
        await asyncio.sleep(0)
        tasks.record("execute", self.name, context=tasks.context_record())
        return self.name


class SlowCleanup(task.Task):
    """Hangs; once its time limit cancels it, takes a few awaits to clean up."""

    time_limit = 0.2

    async def execute(self) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # e.g. telling a remote service to stop
            tasks.record("cleaned up", self.name)
            raise
