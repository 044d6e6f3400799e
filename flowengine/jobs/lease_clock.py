"""The clock a lease is judged by in the process holding it.

A lease (a conductor's claim on a job, a lock) is granted by a service that keeps time on its
own machine, and that time goes on while this host sleeps (a suspended virtual machine, a laptop
lid). ``time.monotonic`` stops counting while the host is suspended on Linux, so a holder woken
after a long sleep would believe it still held a lease that ended long ago. The boot-time clock
counts the sleep too; where it does not exist, the monotonic clock is the best there is.
"""

from __future__ import annotations

import time

__all__ = ["lease_clock"]

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock() -> float:
    """Seconds on a clock that never goes back and keeps counting while the host is suspended
    (``CLOCK_BOOTTIME`` on Linux; ``time.monotonic`` elsewhere)."""
    if _BOOTTIME is None:
        return time.monotonic()
    return time.clock_gettime(_BOOTTIME)
