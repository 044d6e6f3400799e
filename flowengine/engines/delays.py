"""Retry waits as a visible state: a clocked timer for them, and who hears when they start and end.

A retry controller's wait (``delay``/``backoff``/``max_delay``) is held by the engine on every
transport (doc/priorities.rst says why). :class:`DelayTimer` completes a future when a wait is
due by an injected clock, so tests move time instead of sleeping; :class:`RetryWaits` tells
observers (the event listener) when a wait starts or resumes with its due time, and when it ends.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RetryWait:
    """One wait of a retry controller before an attempt, or of a task before it starts.

    Attributes:
        retry_name: the controller's name (the task's, for a task's ``start_delay``).
        attempt: the attempt the wait comes before (2 for the first retry; for a task, the
            attempt of its innermost retry controller, 1 without one).
        due: when the wait ends, in seconds since the epoch (the stored due time); None once
            it has ended.
        seconds: what is left of the wait when it (re)started; 0 once it has ended.
        kind: ``"retry"`` (a controller's ``delay``) or ``"task"`` (a task's ``start_delay``).
    """

    retry_name: str
    attempt: int
    due: float | None
    seconds: float
    kind: str = "retry"


#: Called with a wait that started (``due`` set) or ended (``due`` None).
WaitObserver = Callable[[RetryWait], None]


class RetryWaits:
    """An engine's retry waits: their timer, and the observers told as they start and end.

    Args:
        clock: the timer's clock (monotonic seconds by default; the engine option
            ``retry_clock`` replaces it, so tests move waits along without sleeping).

    Attributes:
        timer: completes each wait's future when it is due (tests call ``timer.check()``
            after moving the clock).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.timer = DelayTimer(clock)
        self._observers: list[WaitObserver] = []
        self._lock = threading.Lock()

    def subscribe(self, observer: WaitObserver) -> None:
        """Call ``observer`` for every wait that starts or ends from now on."""
        with self._lock:
            self._observers = [*self._observers, observer]

    def unsubscribe(self, observer: WaitObserver) -> None:
        """Stop calling ``observer`` (no error if it was not subscribed)."""
        with self._lock:
            # Equal, not the same object: each ``listener.method`` is a new bound method.
            self._observers = [o for o in self._observers if o != observer]

    def announce(self, wait: RetryWait) -> None:
        """Tell every observer about ``wait``; an observer that raises is logged, not fatal."""
        for observer in self._observers:
            try:
                observer(wait)
            except Exception:  # an event sink's fault must not stop the flow
                LOG.exception("Retry wait observer %r failed on %r", observer, wait)


@dataclasses.dataclass
class _Pending:
    due: float
    value: Any
    future: cf.Future


class DelayTimer:
    """Futures that complete when a delay is over, for retry waits without blocking the engine.

    One thread per engine, started with the first delay, sleeps until the earliest due time.

    Args:
        clock: seconds (monotonic by default); tests inject one, move it, then call
            :meth:`check`.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pending: list[_Pending] = []
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def after(self, seconds: float, value: Any) -> cf.Future:
        """A future whose result is ``value``, ``seconds`` from now by the clock."""
        future: cf.Future = cf.Future()
        if seconds <= 0:
            future.set_result(value)
            return future
        with self._changed:
            self._pending.append(_Pending(self._clock() + seconds, value, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True,
                                                name="flowengine-retry-waits")
                self._thread.start()
            self._changed.notify()
        return future

    def check(self) -> None:
        """Complete every future whose delay is over by the clock now."""
        now = self._clock()
        with self._changed:
            due = [p for p in self._pending if p.due <= now]
            self._pending = [p for p in self._pending if p.due > now]
        for pending in due:
            if not pending.future.done():
                pending.future.set_result(pending.value)

    def cancel_all(self) -> None:
        """Cancel every pending delay (waking whoever waits on its future)."""
        with self._changed:
            pending, self._pending = self._pending, []
            self._changed.notify()
        for item in pending:
            item.future.cancel()

    def _watch(self) -> None:
        while True:
            self.check()
            with self._changed:
                # Under the lock after() notifies under, so no new delay is missed.
                next_due = min((p.due for p in self._pending), default=math.inf)
                wait = None if math.isinf(next_due) else max(0.0, next_due - self._clock())
                if wait is None:
                    # Idle: end the thread; the next delay starts another.
                    self._thread = None
                    return
                self._changed.wait(wait)
