"""The messaging edge: publishing, consuming and settling over kombu.

A :class:`Proxy` owns one exchange and one queue. It publishes JSON messages (declaring the target
queue, so messages wait for a consumer that has not started yet), consumes its own queue on the
thread that calls :meth:`Proxy.start`, reconnects with capped, jittered exponential backoff, and
lets any thread settle (ack, requeue, reject) the messages it delivered. Connections, the codec
and per-broker tuning are :mod:`~flowengine.worker_based.connection`'s (its names are
re-exported here).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kombu
from kombu import serialization
from kombu.exceptions import OperationalError
from kombu.transport import virtual

from flowengine.worker_based import backoff as bo
from flowengine.worker_based import dispatcher as dp
from flowengine.worker_based import producers as pd
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import signing as sg
from flowengine.worker_based.connection import (  # noqa: F401 - re-exported names
    CONSUMER_HEARTBEAT,
    REDIS_RESTORE_LOCK_EXPIRE,
    REDIS_VISIBILITY_TIMEOUT,
    BrokerOutage,
    ConnectionDetails,
    StoredMessage,
    connect,
    drain_once,
    mask_url,
    tune,
    without_heartbeat,
)

LOG = logging.getLogger(__name__)

#: Seconds the consume loop waits for a message before it looks at stop requests and settlements.
DRAIN_TIMEOUT = 0.01
#: ... and while it holds messages other threads will settle.
BUSY_DRAIN_TIMEOUT = 0.001
PUBLISH_POOL_SIZE = 8
#: Seconds a publish keeps retrying through a broker outage unless its caller gives its own
#: deadline (the purpose of the message decides: an outcome waits far longer than a request
#: whose engine gives up on it after its transition timeout).
PUBLISH_DEADLINE = 120.0
#: Seconds a declaration is trusted: a broker restarted without its data (or a failover that
#: lost it) forgets queues and bindings without any client seeing an error, so consumers and
#: publishers declare again this often, and after every reconnect.
DECLARATION_TTL = 2.0


class MessageEncodeError(ValueError):
    """A message body is not JSON-serializable, or is larger than the receive bound."""


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


#: Highest message priority queues are declared with (AMQP ``x-max-priority``).
MAX_PRIORITY = 9


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
        publishers: Most publishing connections open at once (per confirm mode).
        paused: Asked on the consumer thread between drains: while it returns True the own
            queue is not consumed (messages already delivered are still handled and settled).
        prefetch: Asked on the consumer thread between drains for the prefetch limit (a pool
            that grows and shrinks); it replaces ``prefetch_count``. After a reconnect the
            limit is lowered by the messages of earlier connections still being processed,
            and comes back as they settle (Celery's consumer does the same).
        signing: Signs what this proxy publishes and checks what it consumes (see
            :mod:`~flowengine.worker_based.signing`); None: neither.
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
        publishers: int = PUBLISH_POOL_SIZE,
        paused: Callable[[], bool] | None = None,
        prefetch: Callable[[], int | None] | None = None,
        signing: sg.Signing | None = None,
    ) -> None:
        self._signing = signing
        if queue_expires is not None and taskflow_compat:
            raise ValueError(f"Queue of topic '{topic}': queue_expires needs taskflow_compat off")
        self._topic, self._exchange_name, self._compat = topic, exchange, taskflow_compat
        self._on_wait, self._on_connected = on_wait, on_connected
        self._paused = paused
        self._prefetch = prefetch
        #: Messages of earlier connections still being processed (by ``id``; kept referenced,
        #: so their ids are not reused).
        self._held_over: dict[int, Any] = {}
        self._prefetch_count, self._drain_timeout = prefetch_count, drain_timeout
        self._extra_routing_keys = tuple(extra_routing_keys)
        self._queue_expires = queue_expires
        self._transient_queue = transient_queue
        self._retry = bo.RetryOptions.from_options(retry_options)
        self._transport_options: dict[str, Any] = dict(transport_options or {})
        self._conn, self._uri = connect(url, transport, self._transport_options)
        transport_cls = self._conn.get_transport_cls()
        # Virtual transports (memory, redis, flowengine-fs...) can settle from any thread.
        self._virtual = issubclass(transport_cls, virtual.Transport)
        driver = getattr(transport_cls, "driver_type", None)
        self._conn, url_heartbeat = without_heartbeat(self._conn)
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
            check=signing.check if signing is not None else None,
        )
        # Message priority is an AMQP queue feature; TaskFlow's declarations have none, and a
        # broker refuses a queue redeclared with different arguments.
        # beanstalkd orders every tube by job priority (see transport_beanstalk); flowengine's
        # Redis, flowengine-fs and memory transports say they order by it.
        self._priorities = not taskflow_compat and (
            not self._virtual or driver == "beanstalk"
            or getattr(transport_cls, "orders_by_priority", False))
        tune(driver, self._transport_options)
        # Publishing pools: [confirmed, unconfirmed]; they differ only where the transport
        # has publisher confirms (AMQP), otherwise both are the same pool.
        self._producers: dict[bool, pd.ProducerPool] = {}
        self._publishers = publishers
        self._pool_lock = threading.Lock()
        self._queues: dict[str, kombu.Queue] = {}
        # Routing key -> when its target was last declared (see DECLARATION_TTL).
        self._declared: dict[str, float] = {}
        self._exchange = kombu.Exchange(
            exchange, type="direct", durable=not taskflow_compat, auto_delete=taskflow_compat
        )
        self._where = f"{self._uri} exchange {exchange!r}"
        self._running = threading.Event()
        self._stop_requested = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._stop_grace = 0.0
        self._lost_at: float | None = None
        #: Seconds the consumer was disconnected before its latest (re)connection (0: none).
        self.last_outage = 0.0
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
        deadline: float | None = None,
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
            priority: Message priority, clamped to 0..MAX_PRIORITY, highest delivered first
                (not in ``taskflow_compat``, nor on kombu transports flowengine does not
                replace; the levels each broker keeps are in doc/priorities.rst).
            confirm: Wait for the broker's confirmation where the transport has publisher
                confirms (AMQP). Outcomes, requests and dead letters need it; progress,
                heartbeats and discovery do not, and skip the round trip.
            persistent: Ask the broker to keep the message across its own restart (the
                default topology); False for messages worth nothing after one.
            deadline: Seconds to keep retrying through a broker outage (None:
                :data:`PUBLISH_DEADLINE`); each retry waits a capped, jittered backoff and
                goes out on a new connection.

        Raises:
            BrokerOutage: The broker stayed unreachable past ``deadline`` (or the retries of
                ``retry_options`` ran out); it names the broker and the message.
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
        if self._signing is not None:
            headers = self._signing.sign(body, properties, headers)
        pending = list(keys)
        errors = self._conn.connection_errors + self._conn.channel_errors + (OperationalError,)
        backoff: bo.Backoff | None = None
        while True:
            try:
                # Each attempt on a producer of its own: one whose publish raised is closed,
                # so a retry goes out on a new connection (a broker back from an outage).
                with self._producer_pool(confirm).acquire() as producer:
                    while pending:
                        self._send(producer.publish, body, pending[0], declare_queue, headers,
                                   properties)
                        pending.pop(0)
                return
            except errors as err:
                # A new connection may face a broker that lost its declarations.
                self._declared.clear()
                if not retry:
                    raise
                if backoff is None:
                    wait = PUBLISH_DEADLINE if deadline is None else deadline
                    backoff = bo.Backoff(self._retry, f"Publishing {msg.TYPE} to {pending[0]!r}",
                                         self._where, self._stop_requested,
                                         deadline=time.monotonic() + wait)
                if backoff.exhausted:
                    raise BrokerOutage(
                        f"Publishing {msg.TYPE} to {pending[0]!r} on {self._where} failed "
                        f"{backoff.attempt + 1} times over {backoff.elapsed:.1f}s: {err}") from err
                try:
                    backoff(err)
                except bo.RetryDeadline as late:
                    raise BrokerOutage(str(late)) from err

    def _send(self, send: Callable[..., Any], body: bytes, key: str, declare_queue: bool,
              headers: Mapping[str, Any] | None, properties: Mapping[str, Any]) -> None:
        # Declaring is idempotent but not free (kombu binds copies of the entities every time),
        # so each routing key's target is declared once, until a connection error.
        wanted = key if declare_queue else ""
        declare = None
        now = time.monotonic()
        if now - self._declared.get(wanted, -math.inf) > DECLARATION_TTL:
            declare = [self._declared_queue(key)] if declare_queue else [self._exchange]
        send(
            body, routing_key=key, exchange=self._exchange, declare=declare,
            content_type=dp.JSON_CONTENT_TYPE, content_encoding="utf-8",
            headers=dict(headers or {}), **properties,
        )  # fmt: skip
        if declare is not None:
            self._declared[wanted] = now

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
                pool = self._producers[key] = pd.ProducerPool(conn, self._publishers)
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
            self._held_over.pop(id(message), None)
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
                except errors + (OperationalError,) as err:
                    # Not serving until consuming again: a worker stops answering discovery.
                    self._running.clear()
                    if self._lost_at is None:
                        self._lost_at = time.monotonic()
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
            # Deliveries of a lost connection are the broker's again: task threads still
            # settle them on their old channel when done (or the broker hands them out again,
            # and a flowengine worker hands a redelivered request back to its engine). Until
            # they are done they hold task slots, so the prefetch leaves room for them.
            self._carry_over()
            # A new connection may face a broker that lost every declaration (restarted
            # empty): nothing declared before is trusted; the consumer declares its own.
            self._declared.clear()
            consumer = conn.Consumer(
                queues=[self._own_queue()],
                on_message=self._on_message,
                accept=[dp.JSON_CONTENT_TYPE],
                prefetch_count=self._prefetch_limit(),
                on_decode_error=self._dispatcher.on_decode_error,
                no_ack=self._auto_ack,
            )
            # Not ``with consumer``: a paused consumer must not take anything, not even
            # between consuming and cancelling.
            consuming = self._follow_pause(consumer, consuming=False)
            limit = consumer.prefetch_count
            try:
                backoff.attempt = 0
                lost_at, self._lost_at = self._lost_at, None
                self.last_outage = 0.0 if lost_at is None else time.monotonic() - lost_at
                self._consumer_thread = threading.get_ident()
                self._running.set()
                _call_hook(self._on_connected)
                declared = time.monotonic()
                while not self._stop_requested.is_set():
                    if time.monotonic() - declared > DECLARATION_TTL:
                        # Heals a queue or binding the broker lost (restarted empty), and
                        # finds a dead connection even when every prefetch slot is busy and
                        # the transport is not reading from it (kombu's Redis QoS).
                        consumer.declare()
                        declared = time.monotonic()
                    # Task threads settle what they took through this loop, between drains:
                    # while some is held, drain briefly, or a settlement (and the prefetch slot
                    # it frees) would wait for the next message or the full timeout.
                    busy = self._held or not self._settlements.empty()
                    drain_once(conn, BUSY_DRAIN_TIMEOUT if busy else self._drain_timeout, errors,
                           self._where)
                    if self._heartbeat:
                        conn.heartbeat_check()
                    self._flush_settlements()
                    _call_hook(self._on_wait)
                    consuming = self._follow_pause(consumer, consuming)
                    if self._prefetch_limit() != limit:
                        limit = self._prefetch_limit()
                        consumer.qos(prefetch_count=limit or 0)
            except errors:
                raise  # the connection is gone, and its consumer with it
            except BaseException:
                with contextlib.suppress(Exception):
                    consumer.cancel()
                raise
            consumer.cancel()
            self._settle_held()

    def _carry_over(self) -> None:
        """Count what the lost connection delivered and is still processed as held over."""
        with self._settle_lock:
            self._held_over.update(self._held)
            self._held.clear()

    @property
    def prefetch_limit(self) -> int | None:
        """The prefetch limit the consumer should have now (None: no limit)."""
        return self._prefetch_limit()

    def _prefetch_limit(self) -> int | None:
        normal = self._prefetch_count
        if self._prefetch is not None:
            try:
                normal = self._prefetch()
            except Exception:  # the owner's bug must not stop the consumer
                LOG.exception("Proxy prefetch %r raised", self._prefetch)
        if normal is None:
            return None
        return max(normal - len(self._held_over), 1)

    def _follow_pause(self, consumer: kombu.Consumer, consuming: bool) -> bool:
        """Consume the own queue or not, as ``paused`` says; whether it is consumed now."""
        wanted = True
        if self._paused is not None:
            try:
                wanted = not self._paused()
            except Exception:  # the owner's bug must not stop the consumer
                LOG.exception("Proxy pause check %r raised; consuming", self._paused)
        if wanted and not consuming:
            consumer.consume()
        elif consuming and not wanted:
            consumer.cancel()
        return wanted

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
