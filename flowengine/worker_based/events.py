"""The event stream: Celery-shaped JSON events on a fanout exchange beside the work exchange.

Engines and workers report what happens through an :class:`~.extensions.EventSink`; an
:class:`EventPublisher` is the sink that publishes. Each event is a JSON object with ``type``
(``category-action``: ``task-started``, ``worker-heartbeat``...), ``hostname``, ``pid``,
``clock`` (a Lamport clock per process), ``timestamp`` (UNIX time), ``utcoffset`` (hours west
of UTC, as Celery) and the event's own fields. doc/operations.rst lists every type.

Publishing is off the hot path: :meth:`EventPublisher.emit` stamps the event and appends it to
a bounded in-memory queue (the oldest event is dropped, and counted, when it is full); one
thread per broker destination and process scrubs, encodes and publishes. It lets a burst
gather for :data:`LINGER` seconds and publishes it as one message whose body is a JSON array
of events (a lone event is sent as the object itself), as Celery's event dispatcher does with
its buffer. Events never carry task arguments or results: scrubbing drops fields that could
hold them, masks URL passwords and reduces failures to their type and (redacted) message.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from flowengine.persistence.backends._uri import mask_urls
from flowengine.types.failure import Failure
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import broadcast as bc
from flowengine.worker_based.broker.connection import TransportSpec
from flowengine.worker_based.broker_spec import Broker

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
_RESERVED = ("type", "hostname", "pid", "clock", "timestamp", "utcoffset")


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


class _Outbox:
    """The queue and publishing thread of one destination, shared by a process's publishers."""

    def __init__(self, broadcast: bc.Broadcast, maxsize: int) -> None:
        self._broadcast = broadcast
        self._queue: collections.deque[tuple[str, int, float, dict[str, Any]]] = (
            collections.deque(maxlen=maxsize))
        self._cond = threading.Condition()
        self._io = threading.Lock()  # one thread publishes or closes at a time
        self._thread: threading.Thread | None = None
        self._idle = False  # the thread waits for the first event of a burst
        self.queued = self.done = self.dropped = self.published = self.failed = 0
        self._hostname, self._utcoffset = socket.gethostname(), utcoffset()

    def put(self, event_type: str, fields: dict[str, Any]) -> None:
        with self._cond:
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

    def abandon(self) -> None:
        """Forget queued events and the thread (in a forked child, where it does not run)."""
        self._cond, self._io = threading.Condition(), threading.Lock()
        self._queue.clear()
        self._thread, self._idle = None, False
        self.done = self.queued


_OUTBOXES: dict[Broker, _Outbox] = {}
_OUTBOXES_LOCK = threading.Lock()
_UNSIGNED = sg.Signing()


def _outbox(exchange: str, url: str | None, transport: TransportSpec | None,
            transport_options: Mapping[str, Any] | None, maxsize: int) -> _Outbox:
    # Events are not signed: the broker's identity without a key (one outbox whatever the
    # process's signing settings).
    key = Broker(exchange, url=url, transport=transport, transport_options=transport_options,
                 signing=_UNSIGNED)
    with _OUTBOXES_LOCK:
        box = _OUTBOXES.get(key)
        if box is None:
            broadcast = bc.Broadcast(events_exchange(exchange), url=url, transport=transport,
                                     transport_options=transport_options)
            box = _OUTBOXES[key] = _Outbox(broadcast, maxsize)
        return box


def _flush_all(timeout: float = EXIT_FLUSH_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    for box in list(_OUTBOXES.values()):
        box.flush(max(deadline - time.monotonic(), 0.0))


def _forget_after_fork() -> None:
    global _OUTBOXES_LOCK
    _OUTBOXES_LOCK = threading.Lock()
    for box in _OUTBOXES.values():
        box.abandon()


atexit.register(_flush_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class EventPublisher(ext.EventSink):
    """Publishes events to ``<exchange>.events`` (a fanout exchange) on the given broker.

    Publishers of one process and destination share one queue, thread and connection, so
    events of one process arrive in clock order. ``emit`` never blocks and never raises.

    Args:
        exchange: The work exchange engines and workers use (events go to ``<exchange>.events``).
        url, transport, transport_options: The broker, as for the worker and the engine.
        maxsize: Events held while the broker is slow or away (the first publisher of a
            destination sets it); beyond it the oldest are dropped and counted in :attr:`dropped`.
    """

    def __init__(self, exchange: str, url: str | None = None,
                 transport: TransportSpec | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 maxsize: int = DEFAULT_QUEUE_SIZE) -> None:
        self._outbox = _outbox(exchange, url, transport, transport_options, maxsize)

    @property
    def dropped(self) -> int:
        """Events dropped because the queue was full (for the whole destination)."""
        return self._outbox.dropped

    @property
    def published(self) -> int:
        """Events published so far (for the whole destination)."""
        return self._outbox.published

    def emit(self, event_type: str, **fields: object) -> None:
        try:
            self._outbox.put(event_type, fields)
        except Exception:  # never on the hot path
            LOG.debug("Event %s not queued", event_type, exc_info=True)

    def flush(self, timeout: float = EXIT_FLUSH_TIMEOUT) -> bool:
        """Wait until the events emitted so far are published; False on timeout."""
        return self._outbox.flush(timeout)

    def close(self) -> None:
        """Publish what is queued (briefly); the shared connection closes once idle."""
        self.flush()


class FanoutSink(ext.EventSink):
    """Sends each event to several sinks (e.g. a publisher and metrics); one failing is logged."""

    def __init__(self, *sinks: ext.EventSink) -> None:
        self.sinks = tuple(s for s in sinks if s is not ext.NO_EVENTS)

    def emit(self, event_type: str, **fields: object) -> None:
        for sink in self.sinks:
            try:
                sink.emit(event_type, **fields)
            except Exception:
                LOG.warning("Event sink %r failed on %s", sink, event_type, exc_info=True)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                LOG.warning("Event sink %r failed closing", sink, exc_info=True)


def combine(*sinks: ext.EventSink) -> ext.EventSink:
    """One sink for ``sinks``: NO_EVENTS for none, the sink itself for one, else a fanout."""
    real = [s for s in sinks if s is not ext.NO_EVENTS]
    if not real:
        return ext.NO_EVENTS
    return real[0] if len(real) == 1 else FanoutSink(*real)


class Ticker:
    """Emits one event every ``interval`` seconds from a daemon thread (worker heartbeats).

    Args:
        sink: Where the events go.
        event_type: What each is.
        interval: Seconds between two.
        fields: Called for each event's fields.
    """

    def __init__(self, sink: ext.EventSink, event_type: str, interval: float,
                 fields: Callable[[], Mapping[str, Any]]) -> None:
        if interval <= 0:
            raise ValueError(f"{event_type} interval must be positive, got {interval}")
        self._sink, self._type, self._interval, self._fields = sink, event_type, interval, fields
        self._stopped = threading.Event()
        self._stopped.set()

    def start(self) -> None:
        """Start ticking (the first event comes after one interval)."""
        if not self._stopped.is_set():
            return
        self._stopped = threading.Event()
        threading.Thread(target=self._run, args=(self._stopped,), daemon=True,
                         name=f"flowengine-{self._type}").start()

    def stop(self) -> None:
        """Stop ticking (no event is emitted after this returns, but one being emitted)."""
        self._stopped.set()

    def _run(self, stopped: threading.Event) -> None:
        while not stopped.wait(self._interval):
            try:
                self._sink.emit(self._type, **self._fields())
            except Exception:
                LOG.warning("Could not emit %s", self._type, exc_info=True)


def matches(event: Mapping[str, Any], types: Iterable[str] = (), flow: str | None = None) -> bool:
    """Whether ``event`` is of one of ``types`` (prefixes: ``task-``) and of flow ``flow``."""
    wanted = tuple(types)
    if wanted and not str(event.get("type", "")).startswith(wanted):
        return False
    return flow is None or event.get("flow_uuid") == flow


class EventReceiver:
    """Reads the event stream through an exclusive, auto-delete queue (JSON only).

    Args:
        exchange: The work exchange (events are read from ``<exchange>.events``).
        url, transport, transport_options: The broker.
        types: Keep only events whose type starts with one of these (``task-``, ``flow-failed``).
        flow: Keep only events of this flow uuid.
    """

    def __init__(self, exchange: str, url: str | None = None,
                 transport: TransportSpec | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 types: Iterable[str] = (), flow: str | None = None) -> None:
        self._broadcast = bc.Broadcast(events_exchange(exchange), url=url, transport=transport,
                                       transport_options=transport_options)
        self._types, self._flow = tuple(types), flow

    @property
    def where(self) -> str:
        """The broker (password masked) and events exchange."""
        return self._broadcast.where

    def iter(self, timeout: float | None = None, ready: Callable[[], None] | None = None,
             stop: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """Yield matching events as they arrive, merging their clocks into :data:`CLOCK`.

        Args:
            timeout: Seconds to listen in all (None: until ``stop`` or the caller stops).
            ready: Called once events published from then on will be received.
            stop: Set it to end the iteration (within a tenth of a second).
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def _stop() -> bool:
            return (stop is not None and stop.is_set()) or (
                deadline is not None and time.monotonic() >= deadline)

        poll = 0.1 if timeout is None else min(0.1, max(timeout, 0.001))
        for body in self._broadcast.listen(_stop, ready=ready, poll=poll):
            for event in body if isinstance(body, list) else [body]:
                if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                    continue
                CLOCK.adjust(event.get("clock"))
                event.setdefault("local_received", time.time())
                if matches(event, self._types, self._flow):
                    yield event

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter()
