"""Publishing over kombu: one direct exchange, its queues' declarations, producer pools.

A :class:`Publisher` publishes JSON messages to ``<exchange>_<routing key>`` queues (declaring
the target queue, so messages wait for a consumer that has not started yet), retrying through a
broker outage with capped, jittered backoff, each retry on a new connection. It also browses
queues (:mod:`~flowengine.worker_based.broker.browsing`). A
:class:`~flowengine.worker_based.broker.proxy.Proxy` is a publisher that also consumes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import kombu
from amqp.exceptions import MessageNacked
from kombu.exceptions import OperationalError

from flowengine.worker_based import backoff as bo
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import browsing
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import producers as pd
from flowengine.worker_based.broker import transport_beanstalk_delays as delays
from flowengine.worker_based.broker import transport_fs_disk as fsdisk
from flowengine.worker_based.broker.codec import encode
from flowengine.worker_based.broker.connection import (
    BrokerOutage,
    BrokerTraits,
    ConnectionDetails,
    QueueKind,
    StoredMessage,
    TransportSpec,
    connect,
    queue_kind,
    reachability,
    traits,
    tune,
    without_heartbeat,
)

# One logger for a proxy and its publishing half, so one log filter follows both.
LOG = logging.getLogger("flowengine.worker_based.broker.proxy")

PUBLISH_POOL_SIZE = 8
#: Seconds a publish keeps retrying through a broker outage unless its caller gives its own
#: deadline (the purpose of the message decides: an outcome waits far longer than a request
#: whose engine gives up on it after its transition timeout).
PUBLISH_DEADLINE = 120.0
#: Seconds a declaration is trusted: a broker restarted without its data (or a failover that
#: lost it) forgets queues and bindings without any client seeing an error, so consumers and
#: publishers declare again this often, and after every reconnect.
DECLARATION_TTL = 2.0
#: Highest message priority queues are declared with (AMQP ``x-max-priority``).
MAX_PRIORITY = 9
#: Reply routing keys a publisher remembers replying to since its last reconnect.
MAX_REPLY_KEYS = 4096
#: Most messages :meth:`Publisher.held` reads (waiting in the queue and unsettled, together);
#: past this it does not tell.
HELD_LIMIT = 20_000


class Publisher:
    """Publishes to ``<exchange>_<routing key>`` queues on direct exchange ``exchange``.

    Args:
        exchange: Exchange name.
        url: Broker URL; with neither ``url`` nor ``transport``, the embedded filesystem transport.
        transport: Kombu transport name or class (``memory``, ``redis``, ``flowengine-fs`` ...).
        transport_options: Kombu transport options (``data_folder`` for ``flowengine-fs``).
        retry_options: See :class:`~flowengine.worker_based.backoff.RetryOptions`.
        taskflow_compat: Declare exactly as TaskFlow (non-durable, auto-delete, transient
            messages) so TaskFlow peers can share the exchange; default is durable and persistent
            (on RabbitMQ, quorum queues when ``url`` names several nodes or transport option
            ``queue_type`` says ``quorum``: see :func:`~.connection.queue_kind`).
        publishers: Most publishing connections open at once (per confirm mode).
        signing: Signs what this publisher publishes (see
            :mod:`~flowengine.worker_based.signing`); None: nothing.
    """

    def __init__(
        self,
        exchange: str,
        url: str | None = None,
        transport: TransportSpec | None = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | bo.RetryOptions | None = None,
        taskflow_compat: bool = False,
        publishers: int = PUBLISH_POOL_SIZE,
        signing: sg.Signing | None = None,
    ) -> None:
        self._signing = signing
        self._exchange_name, self._compat = exchange, taskflow_compat
        self._retry = bo.RetryOptions.from_options(retry_options)
        self._transport_options: dict[str, Any] = dict(transport_options or {})
        self._conn, self._uri = connect(url, transport, self._transport_options)
        self._broker = traits(self._conn.get_transport_cls())
        #: The heartbeat the URL asked for (0: none); only a consume loop sends heartbeats.
        self._conn, self._url_heartbeat = without_heartbeat(self._conn)
        #: Looks at whether the broker accepts connections, for retries' sleeps (Backoff).
        self._probe = reachability(self._conn)
        self._kind: QueueKind = queue_kind(url, self._broker.driver, self._transport_options,
                                           taskflow_compat)
        # Message priority is an AMQP queue feature; TaskFlow's declarations have none, and a
        # broker refuses a queue redeclared with different arguments. Quorum queues refuse
        # x-max-priority; RabbitMQ 4 orders their messages in two levels by the priority
        # property alone (above 4: first), which earlier versions ignore.
        self._priorities = not taskflow_compat and self._broker.priorities and not self._kind.quorum
        self._message_priorities = self._priorities or self._kind.quorum
        tune(self._broker.driver, self._transport_options)
        # Publishing pools: [confirmed, unconfirmed]; they differ only where the transport
        # has publisher confirms (AMQP), otherwise both are the same pool.
        self._producers: dict[bool, pd.ProducerPool] = {}
        self._publishers = publishers
        self._pool_lock = threading.Lock()
        self._queues: dict[str, kombu.Queue] = {}
        # Routing key -> when its target was last declared (see DECLARATION_TTL).
        self._declared: dict[str, float] = {}
        # Connections lost while publishing, and the count as of the last reply to each key
        # (see publish's ``reply``).
        self._reconnects = 0
        self._replied: dict[str, int] = {}
        self._exchange = kombu.Exchange(
            exchange, type="direct", durable=not taskflow_compat, auto_delete=taskflow_compat
        )
        self._where = f"{self._uri} exchange {exchange!r}"
        #: Set to give up retrying (a consuming proxy sets it when asked to stop).
        self._stop_requested = threading.Event()

    @property
    def traits(self) -> BrokerTraits:
        """What this broker does (priorities, native delays ...), see :class:`BrokerTraits`."""
        return self._broker

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

    @property
    def transport_class(self) -> type:
        """The kombu transport class this publisher's connections use."""
        return type(self._conn.transport)

    @property
    def connection_errors(self) -> tuple[type[BaseException], ...]:
        """What this publisher's transport raises when a connection or channel is lost."""
        return tuple(self._conn.connection_errors + self._conn.channel_errors)

    @property
    def queue_kind(self) -> QueueKind:
        """How this publisher declares its durable queues (classic or quorum)."""
        return self._kind

    def disk_watch(self) -> fsdisk.Watch | None:
        """A new watch on the data folder this broker is (flowengine-fs), whose full or
        read-only disk is the broker's outage; None where the broker is a server."""
        return fsdisk.watch(str(self._conn.transport.driver_type), self._transport_options)

    @contextlib.contextmanager
    def delay_receipt(self) -> Iterator[delays.Receipt]:
        """Hold open around a publish with header ``x-flowengine-delay`` where the broker
        holds delays itself (:attr:`BrokerTraits.native_delay`): the delayed job the publish
        puts is recorded in it, as a handle :func:`take_back_delayed` can delete. Elsewhere
        the receipt stays empty."""
        with delays.receipt() as made:
            yield made

    def queue_for(
        self, routing_key: str, extra: Iterable[str] = (), expires: float | None = None,
        transient: bool = False,
    ) -> kombu.Queue:
        """The queue ``<exchange>_<routing_key>`` as this publisher declares it (durable or
        TaskFlow's transient one, priorities, quorum arguments), bound to ``routing_key`` and
        the ``extra`` keys; ``expires``: seconds unused before the broker deletes it;
        ``transient``: non-durable and auto-deleted whatever the topology."""
        name = f"{self._exchange_name}_{routing_key}"
        options: dict[str, Any] = {"durable": not (self._compat or transient),
                                   "auto_delete": self._compat or transient}
        if self._priorities:
            options["max_priority"] = MAX_PRIORITY
        if expires is not None:
            options["expires"] = expires
        if self._kind.quorum and not transient:
            options["queue_arguments"] = self._quorum_arguments(routing_key, expires)
        keys = [routing_key, *extra]
        if len(keys) == 1:
            return kombu.Queue(name, self._exchange, routing_key=routing_key, **options)
        bindings = [kombu.binding(self._exchange, routing_key=key) for key in keys]
        return kombu.Queue(name, bindings=bindings, **options)

    def _quorum_arguments(self, routing_key: str, expires: float | None) -> dict[str, Any]:
        arguments: dict[str, Any] = {"x-queue-type": "quorum"}
        # Topic queues only: a reply queue (it expires) is read by its one engine, and the
        # dead-letter queue is browsed by taking and giving back, which counts deliveries.
        if (self._kind.delivery_limit is not None and expires is None
                and routing_key != ext.DEAD_LETTER_ROUTING_KEY):
            arguments.update({"x-delivery-limit": self._kind.delivery_limit,
                              "x-dead-letter-exchange": self._exchange_name,
                              "x-dead-letter-routing-key": ext.DEAD_LETTER_ROUTING_KEY})
        return arguments

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
        reply: bool = False,
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
            reply: A reply to the consumer of ``<exchange>_<routing_key>`` (an engine's reply
                queue), instead of ``declare_queue``: that queue is its consumer's to declare,
                and is not declared here (an engine that is gone must not get it back), except
                by the first reply to it after this publisher lost its connection, where
                declarations are records a server restarted empty forgets (Redis, beanstalkd,
                flowengine-fs). That reply declares it as its consumer does, so it is kept for
                the consumer rather than dropped unrouted when it beats the consumer's own
                reconnect. AMQP keeps durable declarations across a restart, and would refuse
                other arguments: there only the exchange is declared.

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
        if priority is not None and self._message_priorities:
            properties["priority"] = max(0, min(int(priority), MAX_PRIORITY))
        if self._signing is not None:
            headers = self._signing.sign(body, properties, headers)
        pending = list(keys)
        # A nack (RabbitMQ could not take the message: a quorum queue electing its leader
        # after a node died) is retried like a lost connection.
        errors = (self._conn.connection_errors + self._conn.channel_errors
                  + (OperationalError, MessageNacked))
        backoff: bo.Backoff | None = None
        while True:
            try:
                # Each attempt on a producer of its own: one whose publish raised is closed,
                # so a retry goes out on a new connection (a broker back from an outage).
                with self.producers(confirm).acquire() as producer:
                    while pending:
                        self._send(producer, body, pending[0], declare_queue, reply,
                                   headers, properties)
                        pending.pop(0)
                return
            except errors as err:
                # A new connection may face a broker that lost its declarations.
                self._declared.clear()
                self._reconnects += 1
                if not retry:
                    raise
                if backoff is None:
                    wait = PUBLISH_DEADLINE if deadline is None else deadline
                    backoff = bo.Backoff(self._retry, f"Publishing {msg.TYPE} to {pending[0]!r}",
                                         self._where, self._stop_requested,
                                         deadline=time.monotonic() + wait, probe=self._probe)
                if backoff.exhausted:
                    raise BrokerOutage(
                        f"Publishing {msg.TYPE} to {pending[0]!r} on {self._where} failed "
                        f"{backoff.attempt + 1} times over {backoff.elapsed:.1f}s: {err}") from err
                try:
                    backoff(err)
                except bo.RetryDeadline as late:
                    raise BrokerOutage(str(late)) from err

    def _send(self, producer: kombu.Producer, body: bytes, key: str, declare_queue: bool,
              reply: bool, headers: Mapping[str, Any] | None,
              properties: Mapping[str, Any]) -> None:
        # Declaring is idempotent but not free (kombu binds copies of the entities every time),
        # so each routing key's target is declared once per DECLARATION_TTL, and again after a
        # connection error.
        declare: list[kombu.Queue | kombu.Exchange] | None = None
        wanted = key if declare_queue and not reply else ""
        now = time.monotonic()
        if (reply and self._reconnects > self._replied.get(key, 0)
                and self._broker.declarations_are_records):
            # The first reply to this key since a connection was lost (see publish).
            declare = [self._declared_queue(key, reply=True)]
        elif now - self._declared.get(wanted, -math.inf) > DECLARATION_TTL:
            declare = [*self.declarations(key)] if wanted else [self._exchange]
            self._declared[wanted] = now
            if self._broker.declarations_are_records:
                # Where a server restarted empty forgets declarations without any client
                # seeing an error (Redis reconnects silently), kombu's per-connection memory
                # of what it declared would turn this declaration into nothing, and a request
                # sent before its worker declared again would be dropped unrouted.
                _forget_declared(producer, declare)
        producer.publish(
            body, routing_key=key, exchange=self._exchange, declare=declare,
            content_type=dp.JSON_CONTENT_TYPE, content_encoding="utf-8",
            headers=dict(headers or {}), **properties,
        )  # fmt: skip
        if reply and self._reconnects:
            if len(self._replied) >= MAX_REPLY_KEYS:  # engines come and go: start afresh
                self._replied.clear()
            self._replied[key] = self._reconnects

    def producers(self, confirm: bool = True) -> pd.ProducerPool:
        """The producers publishes of this confirm mode take turns on (made on first use; a
        new pool after :meth:`close`). Confirmed and unconfirmed publishes have pools of their
        own only where the transport has publisher confirms (AMQP)."""
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

    def _declared_queue(self, routing_key: str, reply: bool = False) -> kombu.Queue:
        """The queue a publish declares for ``routing_key`` (built once; building costs): an
        engine's reply queue (``reply``) as its consumer declares it."""
        queue = self._queues.get(routing_key)
        if queue is None:
            expires = ext.REPLY_QUEUE_EXPIRES if reply and not self._compat else None
            queue = self._queues[routing_key] = self.queue_for(routing_key, expires=expires)
        return queue

    def declarations(self, routing_key: str) -> list[kombu.Queue]:
        """What a publish to ``routing_key`` declares: its queue, and the dead-letter queue a
        quorum queue's delivery limit moves messages to (the broker drops a dead letter that
        no queue is bound to receive)."""
        queue = self._declared_queue(routing_key)
        if "x-delivery-limit" in (getattr(queue, "queue_arguments", None) or {}):
            return [self._declared_queue(ext.DEAD_LETTER_ROUTING_KEY), queue]
        return [queue]

    def browse(self, routing_key: str, limit: int = 10_000) -> list[StoredMessage]:
        """Copies of the messages waiting in ``<exchange>_<routing_key>``, oldest first.

        Each is taken and given back (requeued), so the queue is unchanged; meant for operator
        tools on quiet queues (dead letters), not for queues that consumers drain.
        """
        return browsing.visit(self._conn, self.queue_for(routing_key), lambda _m: False, limit)

    def held(self, routing_key: str, request_ids: Collection[str],
             limit: int = HELD_LIMIT) -> set[str] | None:
        """Which of ``request_ids`` the broker still holds for queue ``<exchange>_<routing_key>``:
        waiting there, or delivered to a consumer and not settled yet. None where the transport
        cannot tell (only flowengine's Redis transport can: its deliveries are recorded apart
        from the queue, so a consumer that dies between taking a message and recording it
        loses it), or the queue holds more than ``limit`` messages.

        Raises:
            Whatever the transport raises when the broker cannot be reached.
        """
        if not request_ids or self._broker.driver != "redis":
            return None
        # Imported here: it needs the redis extra, which only Redis users install.
        from flowengine.worker_based.broker import transport_redis

        # On a kept publishing connection: a look every few seconds need not open its own.
        with self.producers(confirm=False).acquire() as producer:
            channel = producer.channel
            if not isinstance(channel, transport_redis.Channel):
                return None
            return channel.held(self.queue_for(routing_key).name, request_ids, limit)

    def take(self, routing_key: str, wanted: Callable[[StoredMessage], bool],
             limit: int = 10_000) -> StoredMessage | None:
        """Remove and return the first waiting message ``wanted`` accepts (others stay)."""
        found = browsing.visit(self._conn, self.queue_for(routing_key), wanted, limit,
                               remove_first_match=True)
        return found[0] if found else None

    def close(self) -> None:
        """Close the publishing connections; a later publish opens new ones."""
        with self._pool_lock:
            pools, self._producers = list(self._producers.values()), {}
        for producers in pools:
            producers.close()


def take_back_delayed(job: str) -> bool:
    """Delete the delayed job ``job`` (a handle from :meth:`Publisher.delay_receipt`, which
    names its server: no publisher is needed); True if it was deleted, False if a worker
    holds it, it is gone, or it is another job under a reused id."""
    return delays.delete(job)


def _forget_declared(producer: kombu.Producer, entities: list[kombu.Queue | kombu.Exchange],
                     ) -> None:
    """Make kombu declare ``entities`` on ``producer``'s connection again (it skips those in
    the connection's ``declared_entities``, kept as long as the connection)."""
    declared: set[int] = producer.channel.connection.client.declared_entities
    for entity in entities:
        declared.discard(hash(entity))
