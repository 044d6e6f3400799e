"""The messaging edge: publishing, consuming and settling over kombu.

A :class:`Proxy` owns one exchange and one queue. It publishes JSON messages (the work of its
base, :class:`~flowengine.worker_based.broker.publisher.Publisher`), consumes its own queue on the
thread that calls :meth:`Proxy.start`, reconnects with capped, jittered exponential backoff, and
lets any thread settle (ack, requeue, reject) the messages it delivered. Connections and
per-broker tuning are :mod:`~flowengine.worker_based.broker.connection`'s, the codec
:mod:`~flowengine.worker_based.broker.codec`'s (their names are re-exported here).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kombu
from kombu.exceptions import OperationalError

from flowengine.worker_based import backoff as bo
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker.codec import MessageEncodeError, encode  # noqa: F401
from flowengine.worker_based.broker.connection import (  # noqa: F401 - re-exported names
    CONSUMER_HEARTBEAT,
    REDIS_RESTORE_LOCK_EXPIRE,
    REDIS_VISIBILITY_TIMEOUT,
    BrokerOutage,
    ConnectionDetails,
    StoredMessage,
    TransportSpec,
    connect,
    drain_once,
    mask_url,
    tune,
    without_heartbeat,
)
from flowengine.worker_based.broker.delivery import Delivery
from flowengine.worker_based.broker.publisher import (  # noqa: F401 - re-exported names
    DECLARATION_TTL,
    MAX_PRIORITY,
    PUBLISH_DEADLINE,
    PUBLISH_POOL_SIZE,
    Publisher,
)

LOG = logging.getLogger(__name__)

#: Seconds the consume loop waits for a message before it looks at stop requests and settlements.
DRAIN_TIMEOUT = 0.01
#: ... and while it holds messages other threads will settle.
BUSY_DRAIN_TIMEOUT = 0.001


def _call_hook(hook: Callable[[], None] | None) -> None:
    # A failing hook is the owner's bug; it must not stop the consumer.
    if hook is None:
        return
    try:
        hook()
    except Exception:
        LOG.exception("Proxy hook %r raised; consuming goes on", hook)


class Proxy(Publisher):
    """Publishes to and consumes from ``<exchange>_<topic>`` on direct exchange ``exchange``.

    Args:
        topic: Routing key of this proxy's own queue.
        exchange: Exchange name.
        type_handlers: Message type -> :class:`~flowengine.worker_based.broker.dispatcher.Handler`.
        on_wait: Called on the consumer thread after every drain (at least every drain timeout).
        url, transport, transport_options, retry_options, taskflow_compat, publishers: See
            :class:`~flowengine.worker_based.broker.publisher.Publisher`.
        prefetch_count: Most unsettled messages the consumer holds (None: no limit).
        extra_routing_keys: More routing keys bound to the own queue (e.g. the discovery key).
        on_connected: Called on the consumer thread each time consuming (re)starts.
        drain_timeout: Seconds between checks for stop requests and cross-thread settlements.
        queue_expires: Seconds an unused own queue lives before the broker deletes it (AMQP
            ``x-expires``; e.g. for an engine's reply queue). Not with ``taskflow_compat``:
            TaskFlow peers declare that queue without arguments, which the broker would refuse.
        on_refused: See :class:`~flowengine.worker_based.broker.dispatcher.TypeDispatcher`.
        transient_queue: Declare the own queue non-durable and auto-deleted (a private queue
            that must vanish with its consumer, such as a worker's control queue).
        auto_ack: Messages of the own queue need no acknowledgement, on Redis only (see
            ``_consume``): for a consumer whose messages are worth nothing once its process is
            gone, such as an engine's replies.
        paused: Asked on the consumer thread between drains: while it returns True the own
            queue is not consumed (messages already delivered are still handled and settled).
        prefetch: Asked on the consumer thread between drains for the prefetch limit (a pool
            that grows and shrinks); it replaces ``prefetch_count``. After a reconnect the
            limit is lowered by the messages of earlier connections still being processed,
            and comes back as they settle (Celery's consumer does the same).
        signing: Signs what this proxy publishes and checks what it consumes (see
            :mod:`~flowengine.worker_based.signing`); None: neither.
        on_requeue: Called with a message the consumer gives back unprocessed because it is
            stopping, before it goes back (see :class:`~.dispatcher.TypeDispatcher`).
    """

    def __init__(
        self,
        topic: str,
        exchange: str,
        type_handlers: Mapping[str, dp.Handler] | None = None,
        on_wait: Callable[[], None] | None = None,
        url: str | None = None,
        transport: TransportSpec | None = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | bo.RetryOptions | None = None,
        taskflow_compat: bool = False,
        prefetch_count: int | None = None,
        extra_routing_keys: Iterable[str] = (),
        on_connected: Callable[[], None] | None = None,
        drain_timeout: float = DRAIN_TIMEOUT,
        queue_expires: float | None = None,
        on_refused: Callable[[Delivery, str, str], None] | None = None,
        transient_queue: bool = False,
        auto_ack: bool = False,
        publishers: int = PUBLISH_POOL_SIZE,
        paused: Callable[[], bool] | None = None,
        prefetch: Callable[[], int | None] | None = None,
        signing: sg.Signing | None = None,
        on_requeue: Callable[[Delivery], None] | None = None,
    ) -> None:
        if queue_expires is not None and taskflow_compat:
            raise ValueError(f"Queue of topic '{topic}': queue_expires needs taskflow_compat off")
        super().__init__(exchange, url=url, transport=transport,
                         transport_options=transport_options, retry_options=retry_options,
                         taskflow_compat=taskflow_compat, publishers=publishers, signing=signing)
        self._topic = topic
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
        # Virtual transports (memory, redis, flowengine-fs...) can settle from any thread.
        self._virtual = self._broker.settles_anywhere
        self._heartbeat = ((self._url_heartbeat or CONSUMER_HEARTBEAT) if self._broker.heartbeats
                           else 0.0)
        self._global_qos = not (self._kind.quorum and not transient_queue)
        #: The owner's prefetch when the consumer's limit was last set (see _prefetch_changed).
        self._qos_normal: int | None = None
        # See BrokerTraits.receipt_ack for why only where the broker works per unacked message.
        self._auto_ack = auto_ack and self._broker.receipt_ack
        self._dispatcher = dp.TypeDispatcher(
            type_handlers, requeue_filters=[lambda _data, _message: not self.is_running],
            on_refused=on_refused, settles=not self._auto_ack,
            check=signing.check if signing is not None else None, settler=self._settle,
            on_requeue=on_requeue,
        )
        self._running = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._stop_grace = 0.0
        #: The consumer's connection attempts (failures so far and the last error), once started.
        self.connecting: bo.Backoff | None = None
        self._lost_at: float | None = None
        #: Seconds the consumer was disconnected before its latest (re)connection (0: none).
        self.last_outage = 0.0
        self._consumer_thread: int | None = None
        self._settle_lock = threading.Lock()
        self._held: dict[int, Any] = {}
        self._settlements: queue.SimpleQueue[tuple[Any, str]] = queue.SimpleQueue()
        #: Consume cycles (drain, settlements, ``on_wait``) completed, and threads waiting for
        #: more (see :meth:`wait_drained`); the condition is touched only while one waits.
        self._cycles = 0
        #: Drains that found nothing to deliver while nothing was held unsettled: after one,
        #: whatever reached the own queue before it began has been handled.
        self.idle_drains = 0
        #: When (monotonic) the latest such drain began (0: none yet): whatever reached the
        #: queue before then has been handled.
        self.idle_at = 0.0
        self._cycle_waiters = 0
        self._cycled = threading.Condition(threading.Lock())

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

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a delivered message (from any thread); as :meth:`Delivery.ack`."""
        delivery.ack()

    def requeue(self, delivery: Delivery) -> None:
        """Give a delivered message back to its queue (from any thread)."""
        delivery.requeue()

    def reject(self, delivery: Delivery) -> None:
        """Drop a delivered message (from any thread)."""
        delivery.reject()

    def touch(self, delivery: Delivery) -> None:
        """Extend a delivered message's time-to-run where the transport has one (beanstalkd's
        ``touch``); elsewhere nothing. From any thread."""
        delivery.touch()

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
        # Every attempt is logged: nothing else shows that the consumer is not serving. A
        # worker's private control queue connects beside its topic queue, which says it already.
        backoff = bo.Backoff(self._retry, f"Connecting (queue {self._exchange_name}_"
                             f"{self._topic})", self._where, self._stop_requested,
                             every=not self._transient_queue, probe=self._probe)
        self.connecting = backoff
        errors = self._conn.connection_errors + self._conn.channel_errors
        LOG.debug("Connecting to %s for queue %s_%s", self._where, self._exchange_name,
                  self._topic)
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
                on_decode_error=self._dispatcher.on_decode_error,
                no_ack=self._auto_ack,
            )
            # The channel's limit (its one consumer's): RabbitMQ applies a later change of a
            # per-consumer limit to new consumers only, and the limit changes as pools grow.
            # Quorum queues refuse a consumer on a channel with a global limit, so there the
            # consumer's own limit is set, and changing it means consuming anew.
            limit = self._prefetch_limit()
            self._qos_normal = self._normal_prefetch()
            if limit is not None:
                consumer.qos(prefetch_count=limit, apply_global=self._global_qos)
            # Not ``with consumer``: a paused consumer must not take anything, not even
            # between consuming and cancelling.
            consuming = self._follow_pause(consumer, consuming=False)
            try:
                backoff.attempt = 0
                lost_at, self._lost_at = self._lost_at, None
                self.last_outage = 0.0 if lost_at is None else time.monotonic() - lost_at
                self._consumer_thread = threading.get_ident()
                self._running.set()
                # Said only once it is true: until then each failed attempt is logged instead.
                LOG.info("Connected to %s: consuming queue %s_%s", self._where,
                         self._exchange_name, self._topic)
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
                    began = time.monotonic()
                    if not drain_once(conn, BUSY_DRAIN_TIMEOUT if busy else self._drain_timeout,
                                      errors, self._where) and not self._held and consuming:
                        self.idle_drains += 1
                        self.idle_at = began
                    if self._heartbeat:
                        conn.heartbeat_check()
                    self._flush_settlements()
                    _call_hook(self._on_wait)
                    self._cycles += 1
                    if self._cycle_waiters:
                        with self._cycled:
                            self._cycled.notify_all()
                    consuming = self._follow_pause(consumer, consuming)
                    if self._prefetch_changed(limit):
                        limit = self._prefetch_limit()
                        self._change_prefetch(consumer, limit, consuming)
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
    def acks_on_receipt(self) -> bool:
        """Whether the broker forgets a delivery as it hands it out (Redis, when the owner
        asked for ``auto_ack``: see :class:`BrokerTraits` ``receipt_ack``); settling is then
        a no-op."""
        return self._auto_ack

    @property
    def prefetch_limit(self) -> int | None:
        """The prefetch limit the consumer should have now (None: no limit)."""
        return self._prefetch_limit()

    def _prefetch_limit(self) -> int | None:
        normal = self._normal_prefetch()
        if normal is None:
            return None
        return max(normal - len(self._held_over), 1)

    def _normal_prefetch(self) -> int | None:
        """The prefetch the owner asks for, before what earlier connections still hold."""
        normal = self._prefetch_count
        if self._prefetch is not None:
            try:
                normal = self._prefetch()
            except Exception:  # the owner's bug must not stop the consumer
                LOG.exception("Proxy prefetch %r raised", self._prefetch)
        return normal

    def _prefetch_changed(self, limit: int | None) -> bool:
        """Whether the consumer's prefetch ``limit`` should change now."""
        wanted = self._prefetch_limit()
        if wanted == limit or self._global_qos:
            return wanted != limit
        # A per-consumer limit changes only by consuming anew (two round trips): when the pool
        # changed size, and once what a lost connection delivered is all settled, not at each
        # of those settlements. Until then the limit may be a little low or, just after a pool
        # grew, the old consumer's deliveries still running may briefly exceed it.
        return not self._held_over or self._normal_prefetch() != self._qos_normal

    def _change_prefetch(self, consumer: kombu.Consumer, limit: int | None,
                         consuming: bool) -> None:
        """Apply a new prefetch ``limit`` to ``consumer`` (consuming anew if it must)."""
        consumer.qos(prefetch_count=limit or 0, apply_global=self._global_qos)
        self._qos_normal = self._normal_prefetch()
        if not self._global_qos and consuming:
            # A per-consumer limit reaches only consumers started after it: consume anew.
            # What the old consumer delivered stays the channel's, settled as before.
            consumer.cancel()
            consumer.consume()

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
        return self.queue_for(self._topic, self._extra_routing_keys, self._queue_expires,
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

    def wait_drained(self, timeout: float | None = None) -> bool:
        """Block until a whole consume cycle (a drain, the settlements queued meanwhile and the
        ``on_wait`` hook) began after this call and ended, so whatever reached the queue before
        the call has been handled; False on timeout."""
        with self._cycled:
            target = self._cycles + 2
            self._cycle_waiters += 1
            try:
                return self._cycled.wait_for(lambda: self._cycles >= target, timeout)
            finally:
                self._cycle_waiters -= 1

    def wait_idle_after(self, since: float, timeout: float) -> bool:
        """Block until a drain begun after ``since`` (monotonic) found nothing: whatever
        reached the queue before then has been handled. False on timeout."""
        with self._cycled:
            self._cycle_waiters += 1
            try:
                return self._cycled.wait_for(lambda: self.idle_at > since, timeout)
            finally:
                self._cycle_waiters -= 1

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
