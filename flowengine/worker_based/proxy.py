"""The messaging edge: the only flowengine module that talks to kombu.

A :class:`Proxy` owns one exchange and one queue. It publishes JSON messages (declaring the target
queue, so messages wait for a consumer that has not started yet), consumes its own queue on the
thread that calls :meth:`Proxy.start`, reconnects with capped, jittered exponential backoff, and
lets any thread settle (ack, requeue, reject) the messages it delivered.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import kombu
from kombu import serialization
from kombu.transport import virtual

from flowengine.persistence.backends._uri import mask_urls
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import dispatcher as dp
from flowengine.worker_based import producers as pd
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import (
    transport_beanstalk,  # noqa: F401  (registers beanstalk://)
    transport_fs,
    transport_memory,
    transport_redis,
)

LOG = logging.getLogger(__name__)

#: Seconds the consume loop waits for a message before it looks at stop requests and settlements.
DRAIN_TIMEOUT = 0.01
#: ... and while it holds messages other threads will settle.
BUSY_DRAIN_TIMEOUT = 0.001
PUBLISH_POOL_SIZE = 8
#: Seconds a message a Redis consumer took stays unsettled before Redis hands it out again
#: (kombu's ``visibility_timeout``, one hour by default; ``transport_options`` may set it).
REDIS_VISIBILITY_TIMEOUT = 30.0
#: Seconds the Redis lock guarding those hand-outs outlives a consumer killed holding it.
REDIS_RESTORE_LOCK_EXPIRE = 10
#: AMQP heartbeat of consuming connections, in seconds, unless the URL sets one (``?heartbeat=N``).
#: A consumer that falls silent this long (killed, frozen with SIGSTOP, cut off) has its connection
#: closed by the broker, which then redelivers what it held. Without it RabbitMQ keeps feeding a
#: frozen process's free prefetch slots forever.
CONSUMER_HEARTBEAT = 10.0


def _connect(url: str | None, transport: Any,
             options: dict[str, Any]) -> tuple[kombu.Connection, str]:
    """The (not yet connected) kombu connection for ``url``/``transport``, and its URI for logs.

    Neither given: the embedded filesystem transport. Kombu's Redis and memory transports are
    swapped for flowengine's (see :mod:`~flowengine.worker_based.transport_redis` and
    :mod:`~flowengine.worker_based.transport_memory`), whose connections name a class instead
    of a scheme in ``as_uri()``, so the URI comes from kombu's.
    """
    if url is None and transport is None:
        transport = transport_fs.TRANSPORT_NAME
    # A host name, even for brokerless transports, keeps kombu from warning on every clone.
    conn = kombu.Connection(url or "localhost", transport=transport, transport_options=options)
    swapped = transport_memory.guarded(transport_redis.lean(conn))
    return swapped, mask_url(conn.as_uri(include_password=True))


def _without_heartbeat(conn: kombu.Connection) -> tuple[kombu.Connection, float]:
    """``conn`` with heartbeats off, and the heartbeat its URL asked for (0: none).

    Only a consume loop sends heartbeats (it calls ``heartbeat_check`` between drains); a
    publishing or one-off connection that negotiated them would be closed by the broker when
    idle, and an unconfirmed publish on it could vanish.
    """
    heartbeat = float(conn.heartbeat or 0)
    return (conn.clone(heartbeat=0) if heartbeat else conn), heartbeat


def _drain(conn: kombu.Connection, timeout: float, errors: tuple[type[BaseException], ...],
           where: str) -> None:
    """One ``drain_events``; connection errors propagate, a bad payload is dropped and logged.

    Kombu's Redis transport decodes a message as it pops it off the list, so a list entry that
    is not kombu's JSON envelope raises here rather than reaching ``on_decode_error``. The entry
    is gone by then, so there is nothing to redeliver; the consumer carries on.
    """
    try:
        conn.drain_events(timeout=timeout)
    except TimeoutError:
        pass
    except errors:
        raise
    except Exception as err:
        LOG.warning("Dropped a message on %s: reason=%s %s: %s", where, dp.REASON_DECODE_ERROR,
                    type(err).__name__, str(err)[:200])


class MessageEncodeError(ValueError):
    """A message body is not JSON-serializable, or is larger than the receive bound."""


def mask_url(url: str | None) -> str:
    """``url`` with passwords replaced by ``***`` (every URL of a ``;`` failover list)."""
    return mask_urls(url or "")


def encode(msg: pr.Message) -> bytes:
    """Serialize ``msg`` as the JSON body that goes on the wire.

    Raises:
        MessageEncodeError: Not JSON-serializable, or over :data:`protocol.MAX_BODY_BYTES`.
    """
    try:
        _, _, data = serialization.dumps(msg.to_dict(), serializer="json")
    except Exception as err:  # kombu wraps the encoder's TypeError/ValueError
        raise MessageEncodeError(f"{msg.TYPE} body is not JSON-serializable: {err}") from err
    body = data.encode("utf-8") if isinstance(data, str) else data
    if len(body) > pr.MAX_BODY_BYTES:
        raise MessageEncodeError(
            f"{msg.TYPE} body is {len(body)} bytes, over the {pr.MAX_BODY_BYTES} byte bound"
        )
    return body


def _call_hook(hook: Callable[[], None] | None) -> None:
    # A failing hook is the owner's bug; it must not stop the consumer.
    if hook is None:
        return
    try:
        hook()
    except Exception:
        LOG.exception("Proxy hook %r raised; consuming goes on", hook)


class ConnectionDetails(NamedTuple):
    """Read-only facts about a proxy's broker connection (the URI has no password)."""

    uri: str
    transport: str
    driver_name: str
    driver_version: str | None
    options: dict[str, Any]


#: Highest message priority queues are declared with (AMQP ``x-max-priority``).
MAX_PRIORITY = 9


class StoredMessage(NamedTuple):
    """A message copied out of a queue: its raw body, headers and properties."""

    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any]

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body.decode("utf-8"))


class Proxy:
    """Publishes to and consumes from ``<exchange>_<topic>`` on direct exchange ``exchange``.

    Args:
        topic: Routing key of this proxy's own queue.
        exchange: Exchange name.
        type_handlers: Message type -> :class:`~flowengine.worker_based.dispatcher.Handler`.
        on_wait: Called on the consumer thread after every drain (at least every drain timeout).
        url: Broker URL; with neither ``url`` nor ``transport``, the embedded filesystem transport.
        transport: Kombu transport name or class (``memory``, ``redis``, ``flowengine-fs`` ...).
        transport_options: Kombu transport options (``data_folder`` for ``flowengine-fs``).
        retry_options: See :class:`~flowengine.worker_based.backoff.RetryOptions`.
        taskflow_compat: Declare exactly as TaskFlow (non-durable, auto-delete, transient
            messages) so TaskFlow peers can share the exchange; default is durable and persistent.
        prefetch_count: Most unsettled messages the consumer holds (None: no limit).
        extra_routing_keys: More routing keys bound to the own queue (e.g. the discovery key).
        on_connected: Called on the consumer thread each time consuming (re)starts.
        drain_timeout: Seconds between checks for stop requests and cross-thread settlements.
        queue_expires: Seconds an unused own queue lives before the broker deletes it (AMQP
            ``x-expires``; e.g. for an engine's reply queue). Not with ``taskflow_compat``:
            TaskFlow peers declare that queue without arguments, which the broker would refuse.
        on_refused: See :class:`~flowengine.worker_based.dispatcher.TypeDispatcher`.
        transient_queue: Declare the own queue non-durable and auto-deleted (a private queue
            that must vanish with its consumer, such as a worker's control queue).
        auto_ack: Messages of the own queue need no acknowledgement, on Redis only (see
            ``_consume``): for a consumer whose messages are worth nothing once its process is
            gone, such as an engine's replies.
    """

    def __init__(
        self,
        topic: str,
        exchange: str,
        type_handlers: Mapping[str, dp.Handler] | None = None,
        on_wait: Callable[[], None] | None = None,
        url: str | None = None,
        transport: Any = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | bo.RetryOptions | None = None,
        taskflow_compat: bool = False,
        prefetch_count: int | None = None,
        extra_routing_keys: Iterable[str] = (),
        on_connected: Callable[[], None] | None = None,
        drain_timeout: float = DRAIN_TIMEOUT,
        queue_expires: float | None = None,
        on_refused: Callable[[Any, str, str], None] | None = None,
        transient_queue: bool = False,
        auto_ack: bool = False,
    ) -> None:
        if queue_expires is not None and taskflow_compat:
            raise ValueError(f"Queue of topic '{topic}': queue_expires needs taskflow_compat off")
        self._topic, self._exchange_name, self._compat = topic, exchange, taskflow_compat
        self._on_wait, self._on_connected = on_wait, on_connected
        self._prefetch_count, self._drain_timeout = prefetch_count, drain_timeout
        self._extra_routing_keys = tuple(extra_routing_keys)
        self._queue_expires = queue_expires
        self._transient_queue = transient_queue
        self._retry = bo.RetryOptions.from_options(retry_options)
        self._transport_options: dict[str, Any] = dict(transport_options or {})
        self._conn, self._uri = _connect(url, transport, self._transport_options)
        transport_cls = self._conn.get_transport_cls()
        # Virtual transports (memory, redis, flowengine-fs...) can settle from any thread.
        self._virtual = issubclass(transport_cls, virtual.Transport)
        driver = getattr(transport_cls, "driver_type", None)
        self._conn, url_heartbeat = _without_heartbeat(self._conn)
        self._heartbeat = (url_heartbeat or CONSUMER_HEARTBEAT) if driver == "amqp" else 0.0
        # Kombu's Redis transport keeps a copy of every unacknowledged delivery in Redis, two
        # round trips per message, to hand it out again if its consumer's process dies holding
        # it; a consumer that acknowledges on receipt gains nothing from that but the cost. On
        # AMQP, deliveries in flight when a connection drops come back only if unacknowledged;
        # on flowengine-fs an acknowledgement is what frees the message's file.
        self._auto_ack = auto_ack and driver == "redis"
        self._dispatcher = dp.TypeDispatcher(
            type_handlers, requeue_filters=[lambda _data, _message: not self.is_running],
            on_refused=on_refused, settles=not self._auto_ack,
        )
        # Message priority is an AMQP queue feature; TaskFlow's declarations have none, and a
        # broker refuses a queue redeclared with different arguments.
        # beanstalkd orders every tube by job priority (see transport_beanstalk).
        self._priorities = not taskflow_compat and (not self._virtual or driver == "beanstalk")
        if driver == "amqp":
            # Publisher confirms: publish() returns only once the broker has the message, so a
            # worker acknowledges a request only after its outcome is safely stored.
            self._transport_options.setdefault("confirm_publish", True)
        if driver == "memory":
            # Kombu's memory transport sleeps a whole second between empty polls by default.
            self._transport_options.setdefault(
                "polling_interval", transport_fs.DEFAULT_POLLING_INTERVAL
            )
        if driver == "redis":
            # Redis returns a message a consumer took and never settled only after this long;
            # kombu's hour would strand the requests a killed worker had taken but not started
            # well past any transition timeout. A request still running when it comes back is
            # handed back, and its engine asks its holder for a heartbeat rather than rerun it.
            self._transport_options.setdefault("visibility_timeout", REDIS_VISIBILITY_TIMEOUT)
            # Handing messages out again takes a Redis lock that expires only after this
            # (kombu: 5 minutes); a consumer killed while holding it stalls every consumer's
            # restores that long. The work under the lock takes milliseconds.
            self._transport_options.setdefault("unacked_mutex_expire", REDIS_RESTORE_LOCK_EXPIRE)
        # Publishing pools: [confirmed, unconfirmed]; they differ only where the transport
        # has publisher confirms (AMQP), otherwise both are the same pool.
        self._producers: dict[bool, pd.ProducerPool] = {}
        self._pool_lock = threading.Lock()
        self._queues: dict[str, kombu.Queue] = {}
        self._declared: set[str] = set()
        self._exchange = kombu.Exchange(
            exchange, type="direct", durable=not taskflow_compat, auto_delete=taskflow_compat
        )
        self._where = f"{self._uri} exchange {exchange!r}"
        self._running = threading.Event()
        self._stop_requested = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._stop_grace = 0.0
        self._consumer_thread: int | None = None
        self._settle_lock = threading.Lock()
        self._held: dict[int, Any] = {}
        self._settlements: queue.SimpleQueue[tuple[Any, str]] = queue.SimpleQueue()

    @property
    def dispatcher(self) -> dp.TypeDispatcher:
        """The dispatcher incoming messages go through."""
        return self._dispatcher

    @property
    def is_running(self) -> bool:
        """Whether the proxy is consuming (and not stopping)."""
        return self._running.is_set()

    @property
    def unsettled(self) -> int:
        """Messages delivered to a manual-ack handler and not settled yet."""
        return len(self._held)

    @property
    def connection_details(self) -> ConnectionDetails:
        """The broker URI (password masked) and transport facts."""
        transport = self._conn.transport
        version = transport.driver_version()
        return ConnectionDetails(
            uri=self._uri,
            transport=str(transport.driver_type),
            driver_name=str(transport.driver_name),
            driver_version=None if not version or version.lower() == "n/a" else str(version),
            options=dict(self._transport_options),
        )

    def _queue(
        self, routing_key: str, extra: Iterable[str] = (), expires: float | None = None,
        transient: bool = False,
    ) -> kombu.Queue:
        name = f"{self._exchange_name}_{routing_key}"
        options: dict[str, Any] = {"durable": not (self._compat or transient),
                                   "auto_delete": self._compat or transient}
        if self._priorities:
            options["max_priority"] = MAX_PRIORITY
        if expires is not None:
            options["expires"] = expires
        keys = [routing_key, *extra]
        if len(keys) == 1:
            return kombu.Queue(name, self._exchange, routing_key=routing_key, **options)
        bindings = [kombu.binding(self._exchange, routing_key=key) for key in keys]
        return kombu.Queue(name, bindings=bindings, **options)

    def publish(
        self,
        msg: pr.Message,
        routing_key: str | Iterable[str],
        reply_to: str | None = None,
        correlation_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        declare_queue: bool = True,
        retry: bool = True,
        expiration: float | None = None,
        priority: int | None = None,
        confirm: bool = True,
        persistent: bool = True,
    ) -> None:
        """Publish ``msg`` to each routing key; thread-safe.

        The body is serialized first, so an unencodable message raises
        :class:`MessageEncodeError` before anything reaches the broker.

        Args:
            msg: The message; its ``TYPE`` becomes the ``type`` property.
            routing_key: One key or several (empty keys are skipped).
            reply_to: Routing key replies should go to.
            correlation_id: Id replies should carry.
            headers: Extension headers (flowengine peers only read them).
            declare_queue: Declare ``<exchange>_<routing_key>`` so the message waits for its
                consumer; False for keys no queue is named after (announcements).
            retry: Retry with backoff on connection errors (False: one attempt).
            expiration: Seconds after which the broker may drop the message unconsumed.
            priority: Message priority, clamped to 0..MAX_PRIORITY (AMQP default topology and
                beanstalkd only; elsewhere dispatch order alone reflects priority).
            confirm: Wait for the broker's confirmation where the transport has publisher
                confirms (AMQP). Outcomes, requests and dead letters need it; progress,
                heartbeats and discovery do not, and skip the round trip.
            persistent: Ask the broker to keep the message across its own restart (the
                default topology); False for messages worth nothing after one.
        """
        body = encode(msg)
        keys = [routing_key] if isinstance(routing_key, str) else list(routing_key)
        keys = [key for key in keys if key]
        if not keys:
            LOG.warning("No routing key for %s on exchange %r; not sent", msg, self._exchange_name)
            return
        properties: dict[str, Any] = {"type": msg.TYPE}
        if reply_to:
            properties["reply_to"] = reply_to
        if correlation_id:
            properties["correlation_id"] = correlation_id
        if not self._compat:
            properties["delivery_mode"] = 2 if persistent else 1
        if expiration is not None:
            properties["expiration"] = expiration
        if priority is not None and self._priorities:
            properties["priority"] = max(0, min(int(priority), MAX_PRIORITY))
        with self._producer_pool(confirm).acquire() as producer:
            pending = list(keys)
            try:
                # The common case: one plain publish per key, no retry machinery around it.
                while pending:
                    self._send(producer.publish, body, pending[0], declare_queue, headers,
                               properties)
                    pending.pop(0)
            except self._conn.connection_errors + self._conn.channel_errors:
                # A new connection may face a broker that lost non-durable declarations.
                self._declared.clear()
                if not retry:
                    raise
                backoff = bo.Backoff(self._retry, "Publishing", self._where, self._stop_requested)
                send = producer.connection.ensure(
                    producer, producer.publish, errback=backoff,
                    max_retries=self._retry.max_retries,
                    interval_start=0, interval_step=0, interval_max=0,
                )  # fmt: skip
                for key in pending:
                    self._send(send, body, key, declare_queue, headers, properties)

    def _send(self, send: Callable[..., Any], body: bytes, key: str, declare_queue: bool,
              headers: Mapping[str, Any] | None, properties: Mapping[str, Any]) -> None:
        # Declaring is idempotent but not free (kombu binds copies of the entities every time),
        # so each routing key's target is declared once, until a connection error.
        wanted = key if declare_queue else ""
        declare = None
        if wanted not in self._declared:
            declare = [self._declared_queue(key)] if declare_queue else [self._exchange]
        send(
            body, routing_key=key, exchange=self._exchange, declare=declare,
            content_type=dp.JSON_CONTENT_TYPE, content_encoding="utf-8",
            headers=dict(headers or {}), **properties,
        )  # fmt: skip
        self._declared.add(wanted)

    def _producer_pool(self, confirm: bool = True) -> pd.ProducerPool:
        confirmed = self._transport_options.get("confirm_publish", False)
        key = bool(confirm or not confirmed)
        pool = self._producers.get(key)  # the common case takes no lock
        if pool is not None:
            return pool
        with self._pool_lock:
            pool = self._producers.get(key)
            if pool is None:
                conn = self._conn
                if not key:
                    options = dict(self._transport_options, confirm_publish=False)
                    conn = self._conn.clone(transport_options=options)
                pool = self._producers[key] = pd.ProducerPool(conn, PUBLISH_POOL_SIZE)
            return pool

    def _declared_queue(self, routing_key: str) -> kombu.Queue:
        """The queue a publish declares for ``routing_key`` (built once; building costs)."""
        queue = self._queues.get(routing_key)
        if queue is None:
            queue = self._queues[routing_key] = self._queue(routing_key)
        return queue

    def browse(self, routing_key: str, limit: int = 10_000) -> list[StoredMessage]:
        """Copies of the messages waiting in ``<exchange>_<routing_key>``, oldest first.

        Each is taken and given back (requeued), so the queue is unchanged; meant for operator
        tools on quiet queues (dead letters), not for queues that consumers drain.
        """
        return self._visit(routing_key, lambda _m: False, limit)

    def take(self, routing_key: str, wanted: Callable[[StoredMessage], bool],
             limit: int = 10_000) -> StoredMessage | None:
        """Remove and return the first waiting message ``wanted`` accepts (others stay)."""
        found = self._visit(routing_key, wanted, limit, remove_first_match=True)
        return found[0] if found else None

    def _visit(self, routing_key: str, wanted: Callable[[StoredMessage], bool], limit: int,
               remove_first_match: bool = False) -> list[StoredMessage]:
        seen: list[StoredMessage] = []
        held: list[Any] = []
        with self._conn.clone() as conn, conn.channel() as channel:
            queue = self._queue(routing_key)(channel)
            queue.declare()
            try:
                while len(held) < limit:
                    message = queue.get(no_ack=False, accept=[dp.JSON_CONTENT_TYPE])
                    if message is None:
                        break
                    stored = StoredMessage(
                        body=message.body if isinstance(message.body, bytes)
                        else str(message.body).encode(),
                        headers=dict(message.headers or {}),
                        properties=dict(message.properties or {}))
                    if remove_first_match and wanted(stored):
                        message.ack()
                        return [stored]
                    held.append(message)
                    seen.append(stored)
            finally:
                # Given back in the order taken, so the queue keeps its order.
                for message in held:
                    message.requeue()
        return [] if remove_first_match else seen

    def close(self) -> None:
        """Close the publishing connections; a later publish opens new ones."""
        with self._pool_lock:
            pools, self._producers = list(self._producers.values()), {}
        for producers in pools:
            producers.close()

    def ack(self, message: Any) -> None:
        """Acknowledge a delivered message (from any thread)."""
        self._settle(message, "ack")

    def requeue(self, message: Any) -> None:
        """Give a delivered message back to its queue (from any thread)."""
        self._settle(message, "requeue")

    def reject(self, message: Any) -> None:
        """Drop a delivered message (from any thread)."""
        self._settle(message, "reject")

    def touch(self, message: Any) -> None:
        """Extend a delivered message's time-to-run where the transport has one (beanstalkd's
        ``touch``); elsewhere nothing. From any thread."""
        touch = getattr(message.channel, "touch", None)
        if touch is not None and not message.acknowledged:
            touch(message.delivery_tag)

    def _settle(self, message: Any, action: str) -> None:
        if self._auto_ack:  # the broker forgot it on delivery: nothing to settle
            return
        # Network channels are not thread-safe: other threads queue settlements for the loop.
        if self._virtual or threading.get_ident() == self._consumer_thread:
            self._settle_now(message, action)
        else:
            self._settlements.put((message, action))

    def _settle_now(self, message: Any, action: str) -> None:
        with self._settle_lock:
            self._held.pop(id(message), None)
            if not message.acknowledged:
                dp.settle(message, action)

    def _flush_settlements(self, block: float = 0.0) -> None:
        while True:
            try:
                if block:
                    message, action = self._settlements.get(timeout=block)
                else:
                    message, action = self._settlements.get_nowait()
            except queue.Empty:
                return
            self._settle_now(message, action)
            block = 0.0

    def _on_message(self, message: Any) -> None:
        self._dispatcher.on_message(message)
        if self._auto_ack:  # settled by the broker already; acks are no-ops
            return
        with self._settle_lock:
            if not message.acknowledged:
                self._held[id(message)] = message  # tags repeat across reconnects

    def start(self) -> None:
        """Consume until :meth:`stop` (blocks), reconnecting as ``retry_options`` allow.

        Raises:
            kombu connection errors: Only once ``max_retries`` reconnects have failed.
        """
        self._stopped.clear()
        backoff = bo.Backoff(self._retry, "Consuming", self._where, self._stop_requested)
        errors = self._conn.connection_errors + self._conn.channel_errors
        LOG.info("Consuming queue %s_%s on %s", self._exchange_name, self._topic, self._where)
        try:
            while not self._stop_requested.is_set():
                try:
                    self._consume(backoff)
                except errors as err:
                    if backoff.exhausted:
                        raise
                    backoff(err)
        except bo.RetryAbandoned:
            pass
        finally:
            self._running.clear()
            self._stop_requested.clear()
            self._stopped.set()

    def _consume(self, backoff: bo.Backoff) -> None:
        with self._conn.clone(heartbeat=self._heartbeat) as conn:
            errors = conn.connection_errors + conn.channel_errors
            conn.ensure_connection(
                errback=backoff, max_retries=self._retry.max_retries,
                interval_start=0, interval_step=0, interval_max=0,
            )  # fmt: skip
            self._held.clear()  # deliveries of a lost connection are the broker's again
            consumer = conn.Consumer(
                queues=[self._own_queue()],
                on_message=self._on_message,
                accept=[dp.JSON_CONTENT_TYPE],
                prefetch_count=self._prefetch_count,
                on_decode_error=self._dispatcher.on_decode_error,
                no_ack=self._auto_ack,
            )
            with consumer:
                backoff.attempt = 0
                self._consumer_thread = threading.get_ident()
                self._running.set()
                _call_hook(self._on_connected)
                while not self._stop_requested.is_set():
                    # Task threads settle what they took through this loop, between drains:
                    # while some is held, drain briefly, or a settlement (and the prefetch slot
                    # it frees) would wait for the next message or the full timeout.
                    busy = self._held or not self._settlements.empty()
                    _drain(conn, BUSY_DRAIN_TIMEOUT if busy else self._drain_timeout, errors,
                           self._where)
                    if self._heartbeat:
                        conn.heartbeat_check()
                    self._flush_settlements()
                    _call_hook(self._on_wait)
                consumer.cancel()
                self._settle_held()

    def _own_queue(self) -> kombu.Queue:
        return self._queue(self._topic, self._extra_routing_keys, self._queue_expires,
                           transient=self._transient_queue)

    def delete_own_queue(self) -> None:
        """Delete this proxy's own queue (and its bindings): for a consumer that is done for
        good, so nothing keeps routing messages to a queue nobody will read."""
        try:
            with self._conn.clone() as conn, conn.channel() as channel:
                queue = self._own_queue()(channel)
                # Kombu's virtual transports (Redis) unbind only bindings the channel knows of:
                # declaring first makes it know them all.
                queue.declare()
                queue.delete()
        except Exception as err:  # best effort: an expiring or already deleted queue is fine
            LOG.debug("Could not delete queue %s_%s: %s", self._exchange_name, self._topic, err)

    def _settle_held(self) -> None:
        deadline = time.monotonic() + self._stop_grace
        while self._held and time.monotonic() < deadline:
            self._flush_settlements(block=0.01)
        self._flush_settlements()
        if self._held:
            LOG.warning(
                "Stopped with %d unsettled message(s) on %s; the broker will redeliver them",
                len(self._held), self._where,
            )  # fmt: skip

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the proxy is consuming; False on timeout."""
        return self._running.wait(timeout)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until :meth:`start` has returned; False on timeout."""
        return self._stopped.wait(timeout)

    def stop(self, grace: float = 0.0) -> None:
        """Stop consuming (returns at once; see :meth:`wait_stopped`).

        Args:
            grace: Seconds to keep settling messages still being processed before the channel
                closes; whatever is unsettled then is redelivered by the broker.
        """
        self._stop_grace = grace
        self._running.clear()
        self._stop_requested.set()


# -- broadcast: the event stream's transport ------------------------------------------------

#: Seconds a broadcast document may wait in a listener's queue before the broker drops it.
BROADCAST_TTL = 60.0
#: Most documents a listener's queue holds on brokers that bound queues (AMQP: oldest dropped).
BROADCAST_MAX_LENGTH = 10_000


class Broadcast:
    """A fanout exchange of transient JSON documents (flowengine's event stream).

    Publishing declares the exchange only, so documents nobody listens for go nowhere. Each
    listener reads through its own exclusive, auto-delete queue, which it unbinds and deletes
    when it stops. Documents are not persistent and expire after :data:`BROADCAST_TTL` seconds;
    on the ``flowengine-fs`` transport a listener killed with SIGKILL leaves its queue folder
    bound (expired documents in it are dropped only when read).

    Args:
        exchange: The fanout exchange's name.
        url, transport, transport_options: As for :class:`Proxy`.
    """

    def __init__(self, exchange: str, url: str | None = None, transport: Any = None,
                 transport_options: Mapping[str, Any] | None = None) -> None:
        options = dict(transport_options or {})
        conn, uri = _connect(url, transport, options)
        self._conn, _ = _without_heartbeat(conn)
        if getattr(self._conn.get_transport_cls(), "driver_type", None) == "memory":
            options.setdefault("polling_interval", transport_fs.DEFAULT_POLLING_INTERVAL)
        self._exchange = kombu.Exchange(exchange, type="fanout", durable=True,
                                        auto_delete=False, delivery_mode="transient")
        self._publishing: Any = None
        self.where = f"{uri} exchange {exchange!r}"

    def publish(self, documents: Iterable[Any]) -> None:
        """Publish each JSON document once, in order (no retries: events are best effort).

        Raises:
            kombu's connection and channel errors; the next call reconnects.
        """
        try:
            if self._publishing is None:
                conn = self._conn.clone()
                conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2,
                                       interval_max=0.2)
                self._publishing = (conn, kombu.Producer(conn.channel(), self._exchange))
            producer = self._publishing[1]
            for document in documents:
                producer.publish(document, routing_key="", serializer="json",
                                 expiration=BROADCAST_TTL, retry=False)
        except Exception:
            self.close()
            raise

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
        received: collections.deque[Any] = collections.deque()
        own = kombu.Queue(
            f"{self._exchange.name}.{uuid.uuid4().hex}", self._exchange, routing_key="",
            durable=False, exclusive=True, auto_delete=True, max_length=BROADCAST_MAX_LENGTH,
        )  # fmt: skip

        def _refused(message: Any, err: Exception) -> None:
            LOG.warning("Dropped a broadcast document on %s that is not JSON: %s", self.where, err)

        with self._conn.clone() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2,
                                   interval_max=0.2)
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
                        _drain(conn, poll, errors, self.where)
                        if ready is not None:
                            announce, ready = ready, None
                            announce()
                        while received:
                            yield received.popleft()
            finally:
                # Virtual transports (memory, flowengine-fs) keep unbound queues' rows otherwise.
                with contextlib.suppress(Exception):
                    bound = own(channel)
                    bound.unbind_from(self._exchange, routing_key="")
                    bound.delete()
