"""Per-task time limits on the local engines: one watchdog thread per run fails overdue calls.

The semantics are the worker-based engine's: ``Task.time_limit`` (or the engine option
``time_limits={"task name": seconds}``, which overrides it) bounds one call of ``execute`` or
``revert``, counted from when the call starts. Past it the atom fails with
:class:`~flowengine.exceptions.TaskTimeLimitExceeded`. A thread cannot be killed, so the call
may still finish; its late result is logged and ignored.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.atom import Atom
from flowengine.task import Task
from flowengine.types.failure import Failure

LOG = logging.getLogger(__name__)

Clock = Callable[[], float]


def parse_time_limits(value: Any) -> dict[str, float]:
    """Validate the ``time_limits`` engine option: ``{task name: seconds > 0}`` (or None).

    Raises:
        ValueError: naming the option and the entry that is wrong.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"Engine option 'time_limits' must map task names to seconds, got {value!r}")
    limits: dict[str, float] = {}
    for name, seconds in value.items():
        try:
            limit = float(seconds)
        except (TypeError, ValueError):
            limit = math.nan
        if not limit > 0 or math.isinf(limit):
            raise ValueError(
                f"Engine option 'time_limits' gives task {name!r} {seconds!r}; a time limit is "
                f"a positive number of seconds")
        limits[str(name)] = limit
    return limits


def limit_for(task: Atom, limits: Mapping[str, float]) -> float | None:
    """The seconds one call of ``task`` may run (the option first, then the class), or None."""
    limit = limits.get(task.name, task.time_limit if isinstance(task, Task) else None)
    return float(limit) if limit else None


def settle(future: cf.Future, value: Any, task_name: str) -> None:
    """Give ``future`` its outcome unless the watchdog already failed it (then log the drop)."""
    try:
        future.set_result(value)
    except cf.InvalidStateError:
        LOG.info("Ignoring the late outcome of task %r: it exceeded its time limit", task_name)


class _Call:
    __slots__ = ("due", "limit", "outcome", "started", "task_name")

    def __init__(self, task_name: str, outcome: str, limit: float, started: float) -> None:
        self.task_name = task_name
        self.outcome = outcome
        self.limit = limit
        self.started = started
        self.due = started + limit


class Watchdog:
    """Fails calls that run past their time limit: one thread per engine run, started lazily.

    Args:
        clock: monotonic seconds; tests inject one and call :meth:`check` after moving it.
    """

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._calls: dict[cf.Future, _Call] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def started(self, future: cf.Future, task_name: str, outcome: str, limit: float) -> None:
        """A call whose outcome ``future`` awaits began now; fail it ``limit`` seconds on."""
        with self._changed:
            self._calls[future] = _Call(task_name, outcome, limit, self._clock())
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._watch, daemon=True,
                                                name="flowengine-time-limits")
                self._thread.start()
            self._changed.notify()

    def finished(self, future: cf.Future) -> None:
        """The call behind ``future`` returned (in time or not)."""
        with self._changed:
            self._calls.pop(future, None)

    def check(self) -> None:
        """Fail every overdue call now."""
        now = self._clock()
        overdue: list[tuple[cf.Future, _Call]] = []
        with self._changed:
            for future, call in list(self._calls.items()):
                if call.due <= now:
                    overdue.append((future, self._calls.pop(future)))
        for future, call in overdue:
            error = exc.TaskTimeLimitExceeded(call.task_name, call.limit,
                                              elapsed=now - call.started)
            LOG.warning("%s", error)
            try:
                future.set_result((call.outcome, Failure.from_exception(error)))
            except cf.InvalidStateError:
                pass  # it finished meanwhile: the outcome it gave stands

    def _watch(self) -> None:
        while True:
            self.check()
            with self._changed:
                if self._stopped:
                    return
                # Under the lock that started() notifies under, so no new call is missed.
                next_due = min((c.due for c in self._calls.values()), default=math.inf)
                wait = None if math.isinf(next_due) else max(0.0, next_due - self._clock())
                self._changed.wait(wait)

    def stop(self) -> None:
        """End the watchdog thread (the engine run is over)."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
