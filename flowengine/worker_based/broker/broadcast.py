"""The broadcast used by the event stream: a fanout exchange of transient JSON documents."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import kombu
from kombu.exceptions import OperationalError

from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker import transport_fs
from flowengine.worker_based.broker.connection import TransportSpec

LOG = logging.getLogger(__name__)

#: Seconds a broadcast document may wait in a listener's queue before the broker drops it.
BROADCAST_TTL = 60.0
#: Most documents a listener's queue holds on brokers that bound queues (AMQP: oldest dropped).
BROADCAST_MAX_LENGTH = 10_000
#: Longest pause, in seconds, between a listener's attempts to reach the broker again.
RELISTEN_MAX_DELAY = 2.0


class Broadcast:
    """A fanout exchange of transient JSON documents (flowengine's event stream).

    Publishing declares the exchange only, so documents nobody listens for go nowhere. Each
    listener reads through its own exclusive, auto-delete queue, which it unbinds and deletes
    when it stops. Documents are not persistent and expire after :data:`BROADCAST_TTL` seconds.
    A listener whose connection is lost (its broker node died) listens again through a new
    queue on whichever node of the URL list answers; documents published meanwhile are not
    received. A publisher whose connection died since its last publish publishes again on a
    new one. On the ``flowengine-fs`` transport a listener killed with SIGKILL leaves its queue
    folder bound (expired documents in it are dropped only when read).

    Args:
        exchange: The fanout exchange's name.
        url, transport, transport_options: As for :class:`Proxy`.
    """

    def __init__(self, exchange: str, url: str | None = None,
                 transport: TransportSpec | None = None,
                 transport_options: Mapping[str, Any] | None = None) -> None:
        options = dict(transport_options or {})
        conn, uri = px.connect(url, transport, options)
        self._conn, _ = px.without_heartbeat(conn)
        if getattr(self._conn.get_transport_cls(), "driver_type", None) == "memory":
            options.setdefault("polling_interval", transport_fs.DEFAULT_POLLING_INTERVAL)
        self._exchange = kombu.Exchange(exchange, type="fanout", durable=True,
                                        auto_delete=False, delivery_mode="transient")
        self._publishing: Any = None
        self.where = f"{uri} exchange {exchange!r}"

    def publish(self, documents: Iterable[Any]) -> None:
        """Publish each JSON document once, in order (events are best effort).

        A connection that served earlier calls may have died unnoticed since (its broker
        restarted, or its cluster node is gone): when it fails, the documents it did not take
        are published once more on a new connection (the first node of the URL list that
        answers), so that the burst that follows a broker's loss is not dropped whole.

        Raises:
            kombu's connection and channel errors; the next call reconnects.
        """
        pending = collections.deque(documents)
        stale = self._publishing is not None
        try:
            try:
                self._publish(pending)
            except self._conn.connection_errors + self._conn.channel_errors as err:
                if not stale:
                    raise
                LOG.debug("The broadcast connection to %s was lost (%s); publishing again",
                          self.where, err)
                self.close()
                self._publish(pending)
        except Exception:
            self.close()
            raise

    def _publish(self, pending: collections.deque[Any]) -> None:
        """Publish on the publishing connection (opened first if need be); each document
        leaves ``pending`` once the broker took it."""
        if self._publishing is None:
            conn = self._conn.clone()
            conn.ensure_connection(max_retries=_each_node(conn), interval_start=0,
                                   interval_step=0.2, interval_max=0.2)
            self._publishing = (conn, kombu.Producer(conn.channel(), self._exchange))
        producer = self._publishing[1]
        while pending:
            producer.publish(pending[0], routing_key="", serializer="json",
                             expiration=BROADCAST_TTL, retry=False)
            pending.popleft()

    def close(self) -> None:
        """Release the publishing connection (a later :meth:`publish` opens a new one)."""
        publishing, self._publishing = self._publishing, None
        if publishing is not None:
            try:
                publishing[0].release()
            except Exception as err:
                LOG.debug("Closing the broadcast connection to %s failed: %s", self.where, err)

    def listen(self, stop: Callable[[], bool], ready: Callable[[], None] | None = None,
               poll: float = 0.1) -> Iterator[Any]:
        """Yield each JSON document published from now on, until ``stop()`` returns True.

        Args:
            stop: Asked after every poll.
            ready: Called once the listener's queue is bound and consumed (on Redis, once the
                subscription is made), i.e. when documents published from then on will arrive.
            poll: Seconds between looks at ``stop``.
        """
        own = kombu.Queue(
            f"{self._exchange.name}.{uuid.uuid4().hex}", self._exchange, routing_key="",
            durable=False, exclusive=True, auto_delete=True, max_length=BROADCAST_MAX_LENGTH,
        )  # fmt: skip
        announce: list[Callable[[], None]] = [ready] if ready is not None else []
        listened: list[bool] = []
        lost = self._conn.connection_errors + self._conn.channel_errors + (OperationalError,)
        delay, pause = 0.0, threading.Event()
        while not stop():
            try:
                for document in self._listen_once(own, stop, announce, listened, poll):
                    delay = 0.0
                    yield document
                return
            except lost as err:
                if not listened:  # never reached the broker: the caller says so
                    raise
                # The exclusive queue went with the connection: a new one is declared on the
                # next connection (the next node of a cluster's URL list, if this one died).
                LOG.warning("Lost the broadcast on %s (%s); listening again", self.where, err)
                pause.wait(delay)
                delay = min(max(delay * 2, poll), RELISTEN_MAX_DELAY)

    def _listen_once(self, own: kombu.Queue, stop: Callable[[], bool],
                     announce: list[Callable[[], None]], listened: list[bool],
                     poll: float) -> Iterator[Any]:
        """Listen on one connection until ``stop()`` (noting in ``listened`` that it did);
        its errors propagate."""
        received: collections.deque[Any] = collections.deque()

        def _refused(message: Any, err: Exception) -> None:
            LOG.warning("Dropped a broadcast document on %s that is not JSON: %s", self.where, err)

        with self._conn.clone() as conn:
            conn.ensure_connection(max_retries=_each_node(conn), interval_start=0,
                                   interval_step=0.2, interval_max=0.2)
            errors = conn.connection_errors + conn.channel_errors
            channel = conn.channel()
            consumer = kombu.Consumer(
                channel, queues=[own], no_ack=True, accept=[dp.JSON_CONTENT_TYPE],
                callbacks=[lambda body, _message: received.append(body)],
                on_decode_error=_refused,
            )  # fmt: skip
            try:
                with consumer:
                    while not stop():
                        px.drain_once(conn, poll, errors, self.where)
                        if not listened:
                            listened.append(True)
                        if announce:
                            announce.pop()()
                        while received:
                            yield received.popleft()
            finally:
                # Deleted first: a virtual transport forgets an unbound queue and would not
                # delete it (flowengine-fs would keep its folder); then unbound, or the memory
                # transport would keep its row.
                with contextlib.suppress(Exception):
                    bound = own(channel)
                    bound.delete()
                    bound.unbind_from(self._exchange, routing_key="")


def _each_node(conn: kombu.Connection) -> int:
    """Retries that try each URL of a failover list once (one retry for a single URL)."""
    return max(1, len(conn.alt))
