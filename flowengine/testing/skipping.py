"""Time skipping: a wait an engine announces is over as soon as nothing else is going on.

An engine announces each retry wait and start delay on ``engine.retry_waits`` once it is
armed (its timer set, or the request carrying it sent or held). :class:`WaitSkipper` hears it
and moves the :class:`~flowengine.testing.clock.ManualClock` the engine reads to the wait's due
time, as Temporal's time-skipping test server fires a timer when no activity runs:

- at once, on the announcing thread, when ``idle()`` says nothing runs (a worker-based engine
  then sends the retry's requests undelayed; a local engine finds its timer due);
- else from its own thread, once ``idle()`` says so; a request the engine held meanwhile, due
  by the clock moved under it, is skipped to again while nothing else runs.

Moving the clock past a wait while a task runs would make that task's time limit or lease
lapse for time that never passed for it; an ``idle`` of None says nothing whose time matters
shares the clock (``flowengine rehearse`` gives its engines their own clock for leases).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from flowengine.engines import RetryWait
from flowengine.testing.clock import ManualClock
from flowengine.worker_based import client as wb_client
from flowengine.worker_based.engine_side import held_publishes

#: Past a wait's due time, so that whatever is due exactly then is due.
PAST_DUE = 0.001
#: Real seconds the broker client takes to publish a held request once it is due.
HOUSEKEEPING = 2 * wb_client.HOUSEKEEPING_PERIOD
#: Times a wait heard while something ran is skipped again while its request stays held.
RESKIPS = 5


def held() -> int:
    """Requests this process's broker clients hold until due."""
    return sum(len(client.held) for client in wb_client.clients())


class WaitSkipper:
    """Skips the waits of the engines it watches on ``clock``.

    Args:
        clock: The clock the engines read (their ``retry_clock``); it also becomes the clock of
            the requests this process's broker clients hold, until :meth:`stop`.
        idle: Says whether nothing runs (None: always); see the module docstring.
        changed: Notified whenever ``idle()`` may have become true (needed with ``idle``).
    """

    def __init__(self, clock: ManualClock, idle: Callable[[], bool] | None = None,
                 changed: threading.Condition | None = None) -> None:
        self.clock = clock
        self._idle = idle or (lambda: True)
        self._changed = changed or threading.Condition()
        self._engines: list[Any] = []
        self._heard: queue.Queue[RetryWait | None] = queue.Queue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved_clock: Callable[[], float] | None = None

    def start(self) -> None:
        """Start skipping (and hold requests by the clock)."""
        self._saved_clock, held_publishes.CLOCK = held_publishes.CLOCK, self.clock
        self._thread = threading.Thread(target=self._skip_later, name="flowengine-skipper",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop skipping; requests are held by the clock they were held by before."""
        self._stopping.set()
        self._heard.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._saved_clock is not None:
            held_publishes.CLOCK = self._saved_clock

    def watch(self, engine: Any) -> None:
        """Skip ``engine``'s waits (it must read :attr:`clock` as its ``retry_clock``)."""
        self._engines.append(engine)
        engine.retry_waits.subscribe(self._hear)

    def check_timers(self) -> None:
        """End the engines' waits that are due by the clock now."""
        for engine in list(self._engines):
            engine.retry_waits.timer.check()

    def _hear(self, wait: RetryWait) -> None:
        if wait.due is None:
            return
        with self._changed:
            if self._idle():
                self._skip_to(wait.due)
                return
        self._heard.put(wait)

    def _skip_to(self, due: float) -> None:
        self.clock.advance_to(due + PAST_DUE)
        self.check_timers()

    def _skip_later(self) -> None:
        while True:
            wait = self._heard.get()
            if wait is None or wait.due is None:
                return
            with self._changed:
                while not self._idle():
                    if self._stopping.is_set():
                        return
                    self._changed.wait(0.05)
            self._skip_to(wait.due)
            # The engine may have armed the wait while the clock moved (its delay counted from
            # before, its due time from after): while nothing else runs and a request is
            # still held, the wait is not over yet.
            for _ in range(RESKIPS):
                if self._stopping.wait(HOUSEKEEPING) or not self._idle() or not held():
                    break
                self.clock.advance(max(wait.seconds, PAST_DUE))
