"""The test kit's clock: it moves only when told to, so a test never waits out real time.

One :class:`ManualClock` stands for every clock a worker-based engine reads in a test kit: the
epoch seconds of retry waits and start delays (engine option ``retry_clock``), the monotonic
seconds of leases, request expiries and time limits (engine option ``clock``) and of the
requests the broker client holds until due. They share one reading, which only
:meth:`ManualClock.advance` and :meth:`ManualClock.advance_to` change; the kit calls them when
it skips a wait or a lapsed lease, and a test may call them itself (to pass a time limit).
"""

from __future__ import annotations

import threading
import time


class ManualClock:
    """Seconds that move only when told (thread-safe; callable, as clocks are injected).

    Args:
        start: The first reading (default: the epoch time now, so stored due times read as
            real dates).
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    @property
    def now(self) -> float:
        """The reading now."""
        return self()

    def advance(self, seconds: float) -> float:
        """Move ``seconds`` forward (never back); return the new reading.

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError(f"a clock moves forward only, not by {seconds} seconds")
        with self._lock:
            self._now += seconds
            return self._now

    def advance_to(self, when: float) -> float:
        """Move to ``when`` if that is later than now; return the new reading."""
        with self._lock:
            self._now = max(self._now, float(when))
            return self._now

    def __repr__(self) -> str:
        return f"<ManualClock {self():.3f}>"
