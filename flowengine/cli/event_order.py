"""Events in time order: a short holding window for ``flowengine events``.

Engines and workers publish their events from several processes, some in batches, so they
reach a listener out of their time order (a worker's ``task-started`` after the engine's
``task-succeeded`` of the same request). :class:`TimeOrder` holds each event for ``window``
seconds after it arrives and releases events by their ``timestamp``: an event that arrives up
to ``window`` seconds late still takes its place. Events without a timestamp keep their arrival
order among the others.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

#: Seconds an event is held for the ones that were published before it but arrive after it.
DEFAULT_WINDOW = 0.3

Event = Mapping[str, Any]


class TimeOrder:
    """Holds events for ``window`` seconds of this process's clock and releases them in
    ``timestamp`` order.

    Args:
        window: Seconds each event is held after it arrives (0: released at once, in arrival
            order).
        clock: This process's monotonic clock (tests pass their own).
    """

    def __init__(self, window: float = DEFAULT_WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._window, self._clock = window, clock
        self._seq = itertools.count()
        # (timestamp, arrival number, event); and when each arrival number is due.
        self._held: list[tuple[float, int, Event]] = []
        self._due: dict[int, float] = {}
        self._last = -math.inf

    def add(self, event: Event) -> None:
        """Hold ``event`` until it is due."""
        stamp = event.get("timestamp")
        # A late event without a timestamp goes with the latest one seen.
        when = float(stamp) if isinstance(stamp, int | float) else self._last
        self._last = max(self._last, when)
        seq = next(self._seq)
        heapq.heappush(self._held, (when, seq, event))
        self._due[seq] = self._clock() + self._window

    def wait(self) -> float | None:
        """Seconds until the next event is due (0: one is), or None when none is held."""
        if not self._due:
            return None
        return max(0.0, min(self._due.values()) - self._clock())

    def release(self) -> list[Event]:
        """The events due now, oldest first, with every held event stamped no later than the
        latest of them (so nothing released later is older than what was released now)."""
        now = self._clock()
        due = [seq for seq, at in self._due.items() if at <= now]
        if not due:
            return []
        upto = max(when for when, seq, _event in self._held if seq in set(due))
        released = []
        while self._held and self._held[0][0] <= upto:
            _when, seq, event = heapq.heappop(self._held)
            self._due.pop(seq, None)
            released.append(event)
        return released

    def drain(self) -> list[Event]:
        """Every held event, oldest first (the stream ended)."""
        released = [event for _when, _seq, event in sorted(self._held)]
        self._held.clear()
        self._due.clear()
        return released
