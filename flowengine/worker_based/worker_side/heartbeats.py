"""The worker's heartbeats: one thread renews every running request's lease at its interval.

The same thread says RUNNING for a request whose engine takes a short task's outcome alone
(protocol 2): its first beat comes after a short threshold, and says RUNNING instead.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger(__name__)


class Heartbeats:
    """Sends every running request's heartbeats from one thread, each at its own interval."""

    def __init__(self) -> None:
        self._due: dict[Any, tuple[float, float | None, Callable[[], None]]] = {}
        self._cond = threading.Condition()
        self._sending = threading.Lock()
        self._thread: threading.Thread | None = None
        # When the thread wakes up by itself next: -inf while it is busy (it looks at every
        # entry before it waits again), +inf while it waits for a first entry. A request added
        # with a later due time needs no wake-up; waking the thread for every request would
        # cost the task threads the GIL once per task.
        self._wake_at = -math.inf

    def add(self, key: Any, interval: float | None, beat: Callable[[], None],
            first: float | None = None) -> None:
        """Call ``beat`` every ``interval`` seconds until :meth:`remove`, the first time after
        ``first`` seconds (default: one interval); ``interval`` None: once, after ``first``."""
        with self._cond:
            wait = first if first is not None else interval
            if wait is None:
                raise ValueError("A beat needs an interval or a first delay")
            due = time.monotonic() + wait
            self._due[key] = (due, interval, beat)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="flowengine-heartbeats", daemon=True
                )
                self._thread.start()
            elif due < self._wake_at:
                self._cond.notify()

    def remove(self, key: Any) -> None:
        """Stop beating for ``key``; once this returns, no heartbeat of it is sent any more."""
        with self._cond:
            self._due.pop(key, None)
        with self._sending:  # waits out a heartbeat of this key being sent right now
            pass

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                beats = []
                for key, (due, interval, beat) in list(self._due.items()):
                    if due <= now:
                        if interval is None:  # once: kept until it is sent (see remove)
                            self._due[key] = (math.inf, interval, beat)
                        else:
                            self._due[key] = (now + interval, interval, beat)
                        beats.append((key, beat))
                if not beats:
                    next_due = min((due for due, _, _ in self._due.values()), default=math.inf)
                    self._wake_at = next_due
                    self._cond.wait(None if next_due == math.inf else next_due - now)
                    self._wake_at = -math.inf
                    continue
            for key, beat in beats:
                with self._sending:
                    # A heartbeat after the outcome would only confuse the engine's logs.
                    if key not in self._due:
                        continue
                    try:
                        beat()
                    except Exception as err:  # the next interval tries again
                        # An outage its transport reported already is not logged per beat.
                        quiet = getattr(err, "reported", False)
                        level = logging.DEBUG if quiet else logging.WARNING
                        LOG.log(level, "Could not send a heartbeat: %s", err)
