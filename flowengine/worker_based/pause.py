"""Pausing a worker topic: the PAUSE control message and a worker's pause state.

An operator (``flowengine topics pause TOPIC``) broadcasts a PAUSE to every flowengine worker
(routing key ``flowengine.discover``, which only their private control queues bind, as for
CANCEL), so it works on every transport. A worker on that topic cancels its topic consumer:
it takes nothing new while the requests it holds run to their end, and the rest wait in the
queue. It consumes again on a resume PAUSE or when the pause's time is up. The pause lives in
the workers that heard it: a worker started later, or one that restarts, is not paused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from flowengine.worker_based import client as cl
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker.connection import TransportSpec
from flowengine.worker_based.broker.delivery import Delivery
from flowengine.worker_based.broker_spec import Broker
from flowengine.worker_based.wire.control import ControlMessage

LOG = logging.getLogger(__name__)

#: The ``type`` property of a PAUSE message (flowengine control queues only).
PAUSE = "PAUSE"
#: Longest pause one message may ask for, in seconds (a day; resume or pause again after).
MAX_SECONDS = 86_400.0


class Pause(ControlMessage):
    """``{"topic", "paused", "seconds"}``: pause (``seconds``; None: until resumed) or resume."""

    TYPE = PAUSE
    SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "topic": {"type": "string", "minLength": 1, "maxLength": 255},
            "paused": {"type": "boolean"},
            "seconds": {"type": ["number", "null"], "exclusiveMinimum": 0,
                        "maximum": MAX_SECONDS},
        },
        "required": ["topic", "paused"],
        "additionalProperties": False,
    }

    def __init__(self, topic: str, paused: bool = True, seconds: float | None = None) -> None:
        self.topic, self.paused, self.seconds = topic, paused, seconds

    def to_dict(self) -> dict[str, Any]:
        """The body."""
        return {"topic": self.topic, "paused": self.paused, "seconds": self.seconds}


class PauseState:
    """Whether a worker's topic is paused, and until when.

    Args:
        on_change: Called with ``(paused, seconds)`` on every change, including a pause that
            runs out (seen by :attr:`paused`, which the consumer asks between drains).
        clock: Monotonic clock in seconds (injected by tests).
    """

    def __init__(self, on_change: Callable[[bool, float | None], None] = lambda *_: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._on_change, self._clock = on_change, clock
        self._lock = threading.Lock()
        self._paused = False
        self._until: float | None = None

    def set(self, paused: bool, seconds: float | None = None) -> None:
        """Pause (for ``seconds``; None: until resumed) or resume."""
        with self._lock:
            changed = paused != self._paused or paused
            self._paused = paused
            self._until = self._clock() + seconds if paused and seconds is not None else None
        if changed:
            self._on_change(paused, seconds if paused else None)

    @property
    def paused(self) -> bool:
        """Whether the topic is paused now (a pause whose time is up ends here)."""
        with self._lock:
            expired = self._paused and self._until is not None and self._clock() >= self._until
            if expired:
                self._paused, self._until = False, None
            paused = self._paused
        if expired:
            self._on_change(False, None)
        return paused

    @property
    def remaining(self) -> float | None:
        """Seconds until the pause runs out (None: not paused, or paused until resumed)."""
        with self._lock:
            if not self._paused or self._until is None:
                return None
            return max(self._until - self._clock(), 0.0)


class TopicPause(PauseState):
    """A worker's pause of its topic: obeys the PAUSE messages for it, announces changes.

    Args:
        topic: The worker's topic.
        worker_id: The worker, in events and logs.
        events: Where ``topic-paused`` and ``topic-resumed`` go.
        in_flight: Requests the worker holds (told in ``topic-paused``).
        clock: As for :class:`PauseState`.
    """

    def __init__(self, topic: str, worker_id: str, events: ext.EventSink,
                 in_flight: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 ) -> None:
        super().__init__(self._announce, clock)
        self._topic, self._worker_id = topic, worker_id
        self._events, self._in_flight = events, in_flight

    def on_message(self, data: Any, message: Delivery) -> None:
        """Handle a (validated) PAUSE: only the ones for this topic count."""
        if data["topic"] != self._topic:
            return
        LOG.info("Worker %s %s topic %r %s", self._worker_id,
                 "pauses" if data["paused"] else "resumes", self._topic, dp.describe(message))
        self.set(data["paused"], data.get("seconds"))

    def _announce(self, paused: bool, seconds: float | None) -> None:
        # Told on the control thread (pause, resume) or the consumer thread (a pause ran out).
        if paused:
            self._events.emit("topic-paused", worker=self._worker_id, topic=self._topic,
                              seconds=seconds, in_flight=self._in_flight())
        else:
            LOG.info("Worker %s takes requests from topic %r again", self._worker_id,
                     self._topic)
            self._events.emit("topic-resumed", worker=self._worker_id, topic=self._topic)


def send_pause(topic: str, exchange: str, paused: bool = True, seconds: float | None = None,
               url: str | None = None, transport: TransportSpec | None = None,
               transport_options: Mapping[str, Any] | None = None) -> None:
    """Pause (for ``seconds``; None: until resumed) or resume ``topic``'s flowengine workers.

    Returns once the broker has the message; each worker on the topic announces the change
    with a ``topic-paused`` or ``topic-resumed`` event when it receives it.

    Raises:
        kombu's connection errors: The broker cannot be reached.
    """
    message = Pause(topic, paused, seconds)
    Pause.validate(message.to_dict())  # refuse here what every worker would refuse
    broker = Broker(exchange, url=url, transport=transport, transport_options=transport_options)
    with cl.borrowed(broker) as client:
        # Every flowengine worker's control queue binds the discovery key; those on other
        # topics ignore it. Confirmed (the default), so it is in their queues on return.
        client.proxy.publish(message, ext.DISCOVER_ROUTING_KEY,
                             headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                             declare_queue=False)
