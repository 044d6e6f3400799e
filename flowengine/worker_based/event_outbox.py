"""The event outbox: what leaves a process as events, scrubbed, stamped, batched and published.

:meth:`EventOutbox.put` stamps an event with the process's Lamport clock (:data:`CLOCK`) and
the time, and appends it to a bounded in-memory queue (the oldest event is dropped, and
counted, when it is full); one thread per outbox scrubs (:func:`scrub`), encodes and publishes.
It lets a burst gather for :data:`LINGER` seconds and publishes it as one message whose body is
a JSON array of events (a lone event is sent as the object itself), as Celery's event
dispatcher does with its buffer. Each broker client owns one outbox
(:meth:`~flowengine.worker_based.client.Client.event_outbox`); the public face of the stream is
:mod:`~flowengine.worker_based.events`.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from flowengine.persistence.backends._uri import mask_urls
from flowengine.types.failure import Failure

LOG = logging.getLogger(__name__)

#: Events waiting to be published, per destination, before the oldest are dropped.
DEFAULT_QUEUE_SIZE = 10_000
#: Seconds a publishing thread idles before it closes its connection and exits.
IDLE_TIMEOUT = 30.0
#: Seconds the publishing thread lets events gather before it publishes them together.
LINGER = 0.01
#: Most events in one message.
MAX_BATCH = 500
#: Seconds the process waits at exit for queued events to be published.
EXIT_FLUSH_TIMEOUT = 2.0
#: Longest text kept in an event field.
MAX_TEXT = 2000
#: Fields dropped from every event, whatever emitted them: they could hold task data.
FORBIDDEN_FIELDS = frozenset(
    {"arguments", "args", "kwargs", "inputs", "result", "results", "store", "details"}
)


def events_exchange(exchange: str) -> str:
    """The events exchange of work exchange ``exchange``."""
    return f"{exchange}.events"


def utcoffset() -> int:
    """Hours west of UTC, as Celery's events carry it."""
    return (time.altzone if time.localtime().tm_isdst else time.timezone) // 3600


class LamportClock:
    """A Lamport clock: :meth:`forward` on every event sent, :meth:`adjust` on every received."""

    def __init__(self) -> None:
        self._value = 0
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        """The current time."""
        return self._value

    def forward(self) -> int:
        """Advance for an event about to be sent; return its time."""
        with self._lock:
            self._value += 1
            return self._value

    def adjust(self, other: object) -> int:
        """Merge the time of a received event (non-integers are ignored)."""
        with self._lock:
            if isinstance(other, int) and not isinstance(other, bool):
                self._value = max(self._value, other)
            self._value += 1
            return self._value


#: This process's clock, shared by every publisher and receiver in it.
CLOCK = LamportClock()


def scrub(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON that cannot carry a secret: masked URLs, failures as type and text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        if "://" in value:
            value = mask_urls(value)
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT]
    if isinstance(value, Failure):
        names = value.exc_type_names
        return {"exc_type": names[0] if names else None,
                "exception": mask_urls(value.exception_str)[:MAX_TEXT]}
    if depth < 3 and isinstance(value, Mapping):
        return {str(k): scrub(v, depth + 1) for k, v in value.items()
                if str(k) not in FORBIDDEN_FIELDS}
    if depth < 3 and isinstance(value, (list, tuple, set, frozenset)):
        return [scrub(item, depth + 1) for item in list(value)[:100]]
    return f"<{type(value).__name__}>"  # its repr could reveal anything


class Publishing(Protocol):
    """Where an outbox publishes (a :class:`~.broker.broadcast.Broadcast`)."""

    where: str

    def publish(self, documents: Iterable[Any]) -> None:
        """Publish each document once, in order (raises when the broker is away)."""

    def close(self) -> None:
        """Release the connection (a later publish opens a new one)."""


def _nothing() -> None:
    return None


class EventOutbox:
    """The queue and publishing thread of one broker client's events.

    Owned by a :class:`~flowengine.worker_based.client.Client` (one per broker and process),
    so every publisher of a destination shares its queue, thread and connection, and events
    of one process arrive in clock order. The thread runs while events wait and exits (closing
    its connection) :data:`IDLE_TIMEOUT` seconds after the last.

    Args:
        broadcast: Where the events go.
        maxsize: Events held while the broker is slow or away; beyond it the oldest are
            dropped and counted in :attr:`dropped`.
        admit: Called (under the outbox's lock) before each event is queued; what it raises
            reaches :meth:`put`'s caller and nothing is queued (a closed client's
            ``ClientClosed``: its publisher moves to the broker's next client).

    Attributes:
        queued: Events queued so far.
        published: Events the broker took.
        failed: Events lost to a failed publish (the broker was away).
        dropped: Events dropped unpublished because the queue was full.
        done: Events published, failed or dropped (``queued - done`` still wait).
    """

    def __init__(self, broadcast: Publishing, maxsize: int,
                 admit: Callable[[], None] = _nothing) -> None:
        self._broadcast = broadcast
        self._admit = admit
        self._queue: collections.deque[tuple[str, int, float, dict[str, Any]]] = (
            collections.deque(maxlen=maxsize))
        self._cond = threading.Condition()
        self._io = threading.Lock()  # one thread publishes or closes at a time
        self._thread: threading.Thread | None = None
        self._idle = False  # the thread waits for the first event of a burst
        self.queued = self.done = self.dropped = self.published = self.failed = 0
        self._hostname, self._utcoffset = socket.gethostname(), utcoffset()

    def put(self, event_type: str, fields: dict[str, Any]) -> None:
        """Queue one event, stamped now with the process's clock (never waits for the broker).

        Raises:
            Whatever ``admit`` raises (nothing is queued then).
        """
        with self._cond:
            self._admit()
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
                self.done += 1
            self._queue.append((event_type, CLOCK.forward(), time.time(), fields))
            self.queued += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="flowengine-events")
                self._thread.start()
            elif self._idle:  # waking it for every event would cost the emitter the GIL
                self._idle = False
                self._cond.notify()

    def _document(self, item: tuple[str, int, float, dict[str, Any]]) -> dict[str, Any]:
        event_type, clock, timestamp, fields = item
        document = scrub(fields)
        document.update(type=event_type, hostname=self._hostname, pid=os.getpid(), clock=clock,
                        timestamp=timestamp, utcoffset=self._utcoffset)
        return document

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                if not self._queue:
                    self._idle = True
                    self._cond.wait_for(lambda: self._queue, IDLE_TIMEOUT)
                    self._idle = False
                    if not self._queue:
                        self._thread = None
                        break
            time.sleep(LINGER)  # let the rest of a burst join it: one message, not many
            with self._cond:
                batch = list(self._queue)
                self._queue.clear()
            try:
                with self._io:
                    self._broadcast.publish(self._bodies(batch))
                self.published += len(batch)
                failures = 0
            except Exception as err:
                self.failed += len(batch)
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    LOG.warning("Could not publish %d event(s) to %s (%d failure(s) in a row): %s",
                                len(batch), self._broadcast.where, failures, mask_urls(str(err)))
            with self._cond:
                self.done += len(batch)
                self._cond.notify_all()
            if failures:  # the broker is away: back off; the bounded queue keeps the newest
                time.sleep(min(0.5 * 2 ** min(failures, 6), 30.0))
        with self._io:
            self._broadcast.close()

    def _bodies(self, batch: list[tuple[str, int, float, dict[str, Any]]]) -> Iterator[Any]:
        for start in range(0, len(batch), MAX_BATCH):
            documents = [self._document(item) for item in batch[start:start + MAX_BATCH]]
            yield documents[0] if len(documents) == 1 else documents

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is published (or failed); False on timeout."""
        with self._cond:
            target = self.queued
            return self._cond.wait_for(lambda: self.done >= target, timeout)

    def close(self, timeout: float = EXIT_FLUSH_TIMEOUT) -> bool:
        """Publish what is queued (within ``timeout`` seconds) and release the connection;
        False if events were left unpublished. A later :meth:`put` starts afresh."""
        flushed = self.flush(timeout)
        with self._io:
            self._broadcast.close()
        return flushed
