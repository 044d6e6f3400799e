"""The event stream: Celery-shaped JSON events on a fanout exchange beside the work exchange.

Engines and workers report what happens through an :class:`~.extensions.EventSink`; an
:class:`EventPublisher` is the sink that publishes. Each event is a JSON object with ``type``
(``category-action``: ``task-started``, ``worker-heartbeat``...), ``hostname``, ``pid``,
``clock`` (a Lamport clock per process), ``timestamp`` (UNIX time), ``utcoffset`` (hours west
of UTC, as Celery) and the event's own fields. doc/operations.rst lists every type.

Publishing is off the hot path: :meth:`EventPublisher.emit` stamps the event and appends it to
the outbox of the process's broker client (:mod:`~flowengine.worker_based.event_outbox`: a
bounded queue whose thread scrubs, batches and publishes). Events never carry task arguments
or results: scrubbing drops fields that could hold them, masks URL passwords and reduces
failures to their type and (redacted) message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from flowengine.worker_based import client as cl
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import broadcast as bc
from flowengine.worker_based.broker.connection import TransportSpec
from flowengine.worker_based.broker_spec import Broker
from flowengine.worker_based.event_outbox import (
    CLOCK,
    DEFAULT_QUEUE_SIZE,
    EXIT_FLUSH_TIMEOUT,
    FORBIDDEN_FIELDS,
    IDLE_TIMEOUT,
    LINGER,
    MAX_BATCH,
    MAX_TEXT,
    EventOutbox,
    LamportClock,
    events_exchange,
    scrub,
    utcoffset,
)

__all__ = [
    "CLOCK", "DEFAULT_QUEUE_SIZE", "EXIT_FLUSH_TIMEOUT", "EventPublisher", "EventReceiver",
    "FORBIDDEN_FIELDS", "FanoutSink", "IDLE_TIMEOUT", "LINGER", "LamportClock", "MAX_BATCH",
    "MAX_TEXT", "Ticker", "combine", "events_exchange", "matches", "scrub", "utcoffset",
]

LOG = logging.getLogger(__name__)

#: Events are not signed: their client's identity carries no key (nor retry policy), so that
#: every publisher of a process and destination shares one outbox whatever those settings.
_UNSIGNED = sg.Signing()


def _destination(exchange: str, url: str | None, transport: TransportSpec | None,
                 transport_options: Mapping[str, Any] | None) -> Broker:
    """The identity of the client whose outbox publishes to ``exchange``'s events."""
    return Broker(exchange, url=url, transport=transport, transport_options=transport_options,
                  signing=_UNSIGNED)


class EventPublisher(ext.EventSink):
    """Publishes events to ``<exchange>.events`` (a fanout exchange) on the given broker.

    Events go out through the outbox of the process's broker client for that destination
    (:meth:`~flowengine.worker_based.client.Client.event_outbox`): publishers of one process
    and destination share one queue, thread and connection, so events of one process arrive
    in clock order. ``emit`` never blocks and never raises.

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
        self._broker = _destination(exchange, url, transport, transport_options)
        self._maxsize = maxsize
        # Made now, not by the first event: an engine's publisher is made as it is loaded, so
        # its run does not pay for the outbox and its connection's set-up.
        self._client = cl.client_for(self._broker)
        self._client.event_outbox(maxsize)

    def _outbox(self) -> EventOutbox:
        client = self._client
        if not client.usable:  # closed (retired when idle), or a forked child's copy
            client = self._client = cl.client_for(self._broker)
        return client.event_outbox(self._maxsize)

    @property
    def dropped(self) -> int:
        """Events dropped because the queue was full (for the whole destination, since its
        client opened)."""
        return self._client.event_outbox().dropped

    @property
    def published(self) -> int:
        """Events published so far (for the whole destination, since its client opened)."""
        return self._client.event_outbox().published

    def emit(self, event_type: str, **fields: object) -> None:
        try:
            try:
                self._outbox().put(event_type, fields)
            except cl.ClientClosed:  # it closed since the look: the broker's next client
                self._outbox().put(event_type, fields)
        except Exception:  # never on the hot path
            LOG.debug("Event %s not queued", event_type, exc_info=True)

    def flush(self, timeout: float = EXIT_FLUSH_TIMEOUT) -> bool:
        """Wait until the events emitted so far are published; False on timeout."""
        client = self._client
        if client.inherited:  # nothing emitted in this process
            return True
        # A client closing meanwhile (retired while idle) publishes what it holds as it closes.
        return client.event_outbox().flush(timeout)

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
