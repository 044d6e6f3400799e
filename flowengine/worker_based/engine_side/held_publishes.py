"""Requests the process's broker client holds until their delay ends (engine-side delays).

Where the broker has no delayed delivery of its own (RabbitMQ without a plugin, Redis,
flowengine-fs, memory), a request dispatched with a delay is held here, by the process-wide
broker client, and published when due. One heap serves every engine of the process and is
looked at by the client's housekeeping (on its consumer thread, every
:data:`~flowengine.worker_based.client.HOUSEKEEPING_PERIOD` seconds), so a thousand waits cost
no thread. A held request can be withdrawn (its engine suspended, or its attempt ended) until
it is published.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

#: Publishes one held request (run on the client's dispatch thread).
Publish = Callable[[], None]
#: The clock of every client's held requests (monotonic seconds), looked up at each use: tests
#: replace it (``monkeypatch.setattr(held_publishes, "CLOCK", manual_clock)``) to move held
#: requests along without sleeping, whichever client an engine attaches to.
CLOCK: Callable[[], float] = time.monotonic


class HeldPublishes:
    """Publishes held until due by a clock, each under a key (the request's attempt id).

    Args:
        clock: monotonic seconds (default: :data:`CLOCK`, as it is when used).
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, str]] = []
        self._held: dict[str, tuple[int, Publish]] = {}
        self._order = itertools.count()
        self._lock = threading.Lock()

    def clock(self) -> float:
        """Now, by the clock held requests are due by."""
        return (self._clock or CLOCK)()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def hold(self, key: str, seconds: float, publish: Publish) -> None:
        """Run ``publish`` once ``seconds`` have passed, unless ``key`` is withdrawn first."""
        due = self.clock() + seconds
        with self._lock:
            order = next(self._order)
            self._held[key] = (order, publish)
            heapq.heappush(self._heap, (due, order, key))

    def withdraw(self, key: str) -> bool:
        """Drop the publish held under ``key``; True if one was (it will never run)."""
        with self._lock:
            return self._held.pop(key, None) is not None

    def take_due(self) -> list[Publish]:
        """The publishes whose time has come, in due order (no longer held)."""
        now = self.clock()
        due: list[Publish] = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                _, order, key = heapq.heappop(self._heap)
                held = self._held.get(key)
                if held is not None and held[0] == order:  # else withdrawn (or held anew)
                    del self._held[key]
                    due.append(held[1])
        return due
