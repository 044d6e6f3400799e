"""When the claims a board knows of end, for backends whose service does not announce it.

Redis does not tell anyone that a key expired (without keyspace notifications, which a shared
server may not enable), so a Redis board's waiters sleep until the soonest claim end they know
of. Those ends come from the claims' own times to live, heard in the board's change messages;
a claim whose end passed without news is asked about (its renewal or release may have been
missed), never polled on a period.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

__all__ = ["LeaseTimes"]

#: Seconds to wait before asking again when the service could not be asked.
RETRY_AFTER = 0.5


class LeaseTimes:
    """The known end of each claim, by job uuid, on a monotonic clock.

    Args:
        clock: The monotonic clock (injected in tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ends: dict[str, float] = {}

    def claimed(self, job_uuid: str, ttl_ms: float) -> None:
        """A claim on ``job_uuid`` was taken or renewed for ``ttl_ms``."""
        with self._lock:
            self._ends[job_uuid] = self._clock() + ttl_ms / 1000

    def released(self, job_uuid: str) -> None:
        """The claim on ``job_uuid`` ended (or the job is gone)."""
        with self._lock:
            self._ends.pop(job_uuid, None)

    def reset(self, ttls_ms: Mapping[str, int]) -> None:
        """Replace everything with the claims' remaining times (ms; <= 0: no claim)."""
        now = self._clock()
        with self._lock:
            self._ends = {u: now + ttl / 1000 for u, ttl in ttls_ms.items() if ttl and ttl > 0}

    def next_wakeup(self, remaining_ms: Callable[[list[str]], list[int]]) -> float | None:
        """Seconds until the soonest known claim ends (0: one just did; None: none known).

        Args:
            remaining_ms: Asks the service for the remaining ms of the given claims (<= 0 when
                gone); called only for claims whose known end has passed.
        """
        now = self._clock()
        with self._lock:
            ends = dict(self._ends)
        overdue = [u for u, end in ends.items() if end <= now]
        if overdue:
            try:
                answers = remaining_ms(overdue)
            except Exception:  # the service is unreachable: ask again a little later
                return RETRY_AFTER
            ended = False
            with self._lock:
                for job_uuid, ttl in zip(overdue, answers, strict=True):
                    if ttl and ttl > 0:
                        self._ends[job_uuid] = ends[job_uuid] = now + ttl / 1000
                    else:
                        self._ends.pop(job_uuid, None)
                        ends.pop(job_uuid, None)
                        ended = True
            if ended:
                return 0.0
        return max(0.0, min(ends.values()) - now) if ends else None
