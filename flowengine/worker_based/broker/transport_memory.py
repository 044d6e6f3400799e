"""kombu's in-memory transport with its declarations made thread-safe.

Kombu's memory transport keeps one broker state per process, shared by every connection, and
declares without a lock. Two threads declaring the same new exchange (an engine publishing a
request while a worker's consumer starts, say) can both find it missing and both create it; the
second creation replaces the first with an empty routing table, after the first thread had
bound its queue in it. The binding is still recorded, so the second thread's bind sees it and
adds nothing: the queue is bound in name only, and every message published to it is dropped as
unroutable. A loop of fresh exchanges declared from two threads loses a message in about one
round in 500 to 1,000 on CPython 3.11; a unit test of the consumer's reconnection failed in CI
this way.

Its queues also order by message priority as AMQP brokers do (kombu's are plain FIFOs): the
highest ``priority`` property (0..9, absent is 0) is delivered first, FIFO within a priority
(see :class:`PriorityFifo`).

Kombu's consumers find a new message by polling: an empty poll sleeps the transport's
``polling_interval``, cut to the drain's timeout (10 ms for flowengine's consumers), so every
hop of a request or reply waited about half that on average. Here every put rings a
process-wide :class:`Doorbell` and a drain waits for the ring instead of sleeping; a message
put where no bell rings (a stock kombu memory channel creating a queue of its own) is still
found within the old poll.

This channel takes one process-wide lock around each check-then-create step (exchange and queue
declarations, binds, unbinds, deletions). Everything else, and all the state, stays kombu's, so
a connection made with plain ``transport="memory"`` elsewhere in the process sees the same
exchanges and queues. ``memory://`` URLs and ``transport="memory"`` get this transport through
:func:`guarded`, which :class:`~.proxy.Proxy` and
:class:`~.broadcast.Broadcast` call; kombu's alias table is left alone.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from queue import Empty, Queue
from typing import Any

import kombu
from kombu.transport import memory

#: The transport names (URL schemes) :func:`guarded` replaces.
STOCK_NAMES = frozenset({"memory"})

# One lock for the process: kombu's memory broker state is one per process.
_DECLARING = threading.RLock()


def _declaring(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` run while holding :data:`_DECLARING`."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _DECLARING:
            return method(self, *args, **kwargs)

    return locked


class Doorbell:
    """Rung by every put into a :class:`PriorityFifo`; waited on by drains with nothing to
    deliver. A count of rings, read before a drain looks, tells a wait whether a put came in
    between (then it does not wait): no ring is lost between the look and the wait."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self.rings = 0

    def ring(self) -> None:
        """Wake every drain waiting for a message."""
        with self._cond:
            self.rings += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> None:
        """Return once the bell rang after ``seen`` rings, or after ``timeout`` seconds."""
        with self._cond:
            if self.rings == seen:
                self._cond.wait(timeout)


#: The bell of the process's memory broker (one broker state per process, as kombu's).
BELL = Doorbell()


class PriorityFifo(Queue):  # type: ignore[type-arg]  # holds kombu's message dicts
    """A :class:`queue.Queue` of kombu messages, highest ``priority`` property first, FIFO
    within a priority. ``queue`` is a heap of ``(-priority, sequence, message)``, so kombu's
    ``queue.clear()`` (a purge) and ``qsize()`` work on it unchanged."""

    def _init(self, maxsize: int) -> None:
        self.queue: list[tuple[int, int, Any]] = []  # type: ignore[assignment]
        self._sequence = itertools.count()

    def _qsize(self) -> int:
        return len(self.queue)

    def _put(self, message: Any) -> None:
        heapq.heappush(self.queue, (-message_priority(message), next(self._sequence), message))
        BELL.ring()

    def _get(self) -> Any:
        return heapq.heappop(self.queue)[2]


def message_priority(message: Any) -> int:
    """A kombu message's ``priority`` property, clamped to 0..9 as kombu's virtual channels
    clamp it (absent or not a number: 0)."""
    try:
        return max(0, min(int(message["properties"]["priority"]), memory.Channel.max_priority))
    except (KeyError, TypeError, ValueError):
        return 0


class Channel(memory.Channel):
    """kombu's memory channel; declarations hold :data:`_DECLARING`."""

    #: What a closed channel took and never settled goes back to its queue, as a real broker
    #: gives back a dead consumer's deliveries (kombu's memory channel drops them): a worker
    #: stopped in-process then loses no request (tests/integration/test_transport_contract.py).
    do_restore = True

    exchange_declare = _declaring(memory.Channel.exchange_declare)
    exchange_delete = _declaring(memory.Channel.exchange_delete)
    queue_declare = _declaring(memory.Channel.queue_declare)
    queue_bind = _declaring(memory.Channel.queue_bind)
    queue_unbind = _declaring(memory.Channel.queue_unbind)
    queue_delete = _declaring(memory.Channel.queue_delete)

    def _queue_for(self, queue: str) -> Queue[Any]:
        # Also a check-then-create: a publish and a declare racing on a new queue could each
        # make one, and the message put in the replaced one would be lost.
        found: Queue[Any] | None = self.queues.get(queue)
        if found is not None:
            return found
        with _DECLARING:
            return self.queues.setdefault(queue, PriorityFifo())

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self._queue_for(queue)


class Transport(memory.Transport):
    """kombu's memory transport over :class:`Channel` (same process-wide broker state)."""

    Channel = Channel
    #: Queues deliver the highest message priority first (flowengine's proxy sets it).
    orders_by_priority = True

    def drain_events(self, connection: Any, timeout: float | None = None,
                     **_kwargs: Any) -> None:
        """Deliver one message, waiting for the doorbell between looks (kombu's sleeps);
        ``socket.timeout`` if none came within ``timeout`` seconds."""
        began = time.monotonic()
        # Still the longest wait between looks: a put that rings no bell is found by then.
        poll = self.polling_interval or 1.0
        cycle = self.cycle
        assert cycle is not None  # made with the transport
        while True:
            seen = BELL.rings
            try:
                cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                pass
            left = poll if timeout is None else timeout - (time.monotonic() - began)
            if left <= 0:
                raise TimeoutError()  # socket.timeout, as kombu's drains raise
            BELL.wait(seen, min(left, poll))


def guarded(conn: kombu.Connection) -> kombu.Connection:
    """``conn`` on :class:`Transport` if kombu would use its stock memory transport, else
    ``conn`` (a clone keeping its options; kombu's ``as_uri()`` of it names the class)."""
    if conn.transport_cls in STOCK_NAMES:
        return conn.clone(transport=Transport)
    return conn
