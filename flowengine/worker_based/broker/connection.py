"""Connections to the broker: transport selection and per-broker tuning.

:func:`connect` is the one place a transport is chosen (flowengine's own transports are
registered with kombu by their modules); :class:`BrokerTraits` and :func:`tune` the one place
broker-specific behaviour and options are decided. It imports kombu, as only the modules of
the broker package may.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import socket
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

import kombu
from kombu import transport as kombu_transport
from kombu.exceptions import OperationalError
from kombu.transport import base as kombu_base
from kombu.transport import virtual

from flowengine.persistence.backends._uri import mask_urls
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import (
    transport_beanstalk,  # noqa: F401  (registers beanstalk://)
    transport_fs,
    transport_memory,
)

LOG = logging.getLogger("flowengine.worker_based.broker.proxy")

#: The URL schemes doc/workers.rst describes, named when a URL has none of kombu's.
DOCUMENTED_SCHEMES = ("amqp", "amqps", "redis", "rediss", "sentinel", "beanstalk",
                      "flowengine-fs", "memory")
#: Transport names (URL schemes) served by flowengine's Redis transport
#: (:func:`~flowengine.worker_based.broker.transport_redis.lean`), Sentinel's included.
REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel"})

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


#: How a transport is named where a URL does not say it: kombu's transport name or alias
#: (``"memory"``, ``"redis"``, ``"flowengine-fs"``...), a ``module:Class`` path, or the
#: transport class itself.
TransportSpec: TypeAlias = str | type[kombu_base.Transport]


def check_transport(transport: object) -> TransportSpec | None:
    """``transport`` if it can name a transport (None: the URL says, or the default), else a
    TypeError that names the bad value (kombu's own error for one comes from deep inside)."""
    if transport is None or isinstance(transport, str) or (
            isinstance(transport, type) and issubclass(transport, kombu_base.Transport)):
        return transport
    raise TypeError(f"Broker option 'transport' must be a transport name or a kombu Transport "
                    f"class, not {transport!r}")


def connect(url: str | None, transport: TransportSpec | None,
             options: dict[str, Any]) -> tuple[kombu.Connection, str]:
    """The (not yet connected) kombu connection for ``url``/``transport``, and its URI for logs.

    Neither given: the embedded filesystem transport. Kombu's Redis and memory transports are
    swapped for flowengine's (see :mod:`~flowengine.worker_based.broker.transport_redis` and
    :mod:`~flowengine.worker_based.broker.transport_memory`), whose connections name a class instead
    of a scheme in ``as_uri()``, so the URI comes from kombu's.
    """
    if url is None and transport is None:
        transport = transport_fs.TRANSPORT_NAME
    scheme = transport if transport is not None else (url or "").partition("://")[0]
    if scheme in REDIS_SCHEMES:
        # Imported only for a Redis broker, and before kombu resolves the scheme: kombu's
        # Redis transport needs the redis extra, and says so with an AttributeError.
        from flowengine.worker_based.broker import transport_redis
    # A host name, even for brokerless transports, keeps kombu from warning on every clone.
    try:
        conn = kombu.Connection(url or "localhost", transport=transport,
                                transport_options=options)
    except KeyError as err:  # kombu's "No such transport", from deep inside
        raise unknown_transport(url, transport) from err
    swapped = transport_redis.lean(conn) if scheme in REDIS_SCHEMES else conn
    return transport_memory.guarded(swapped), mask_url(conn.as_uri(include_password=True))


class BrokerURLError(ValueError):
    """A broker URL (or transport name) names no transport kombu or flowengine has."""


def unknown_transport(url: str | None, transport: TransportSpec | None) -> BrokerURLError:
    """The one-line error for a URL scheme or transport name that no transport answers to,
    saying which part is wrong and what it could have been."""
    name = str(transport) if transport is not None else (url or "").partition("://")[0]
    name = name.partition("+")[0]  # kombu's "scheme+real-url" form names its transport first
    known = sorted(set(kombu_transport.TRANSPORT_ALIASES) - {"librabbitmq"})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = f"broker URL {mask_url(url)}" if url and transport is None else "transport name"
    return BrokerURLError(f"Unknown transport {name!r} in the {where}{hint}; flowengine's "
                          f"brokers: {', '.join(DOCUMENTED_SCHEMES)} (and kombu's other "
                          f"transports)")


def without_heartbeat(conn: kombu.Connection) -> tuple[kombu.Connection, float]:
    """``conn`` with heartbeats off, and the heartbeat its URL asked for (0: none).

    Only a consume loop sends heartbeats (it calls ``heartbeat_check`` between drains); a
    publishing or one-off connection that negotiated them would be closed by the broker when
    idle, and an unconfirmed publish on it could vanish.
    """
    heartbeat = float(conn.heartbeat or 0)
    return (conn.clone(heartbeat=0) if heartbeat else conn), heartbeat


def drain_once(conn: kombu.Connection, timeout: float, errors: tuple[type[BaseException], ...],
           where: str) -> bool:
    """One ``drain_events``; connection errors propagate, a bad payload is dropped and logged.
    Returns False if nothing arrived within ``timeout``.

    Kombu's Redis transport decodes a message as it pops it off the list, so a list entry that
    is not kombu's JSON envelope raises here rather than reaching ``on_decode_error``. The entry
    is gone by then, so there is nothing to redeliver; the consumer carries on.
    """
    try:
        conn.drain_events(timeout=timeout)
    except TimeoutError:
        return False
    except errors:
        raise
    except Exception as err:
        LOG.warning("Dropped a message on %s: reason=%s %s: %s", where, dp.REASON_DECODE_ERROR,
                    type(err).__name__, str(err)[:200])
    return True


#: Transport options flowengine reads itself (kombu's transports ignore them): the type of the
#: durable queues declared on an AMQP broker, and how often a quorum queue delivers one message
#: before handing it to the dead-letter queue.
QUEUE_TYPE_OPTION = "queue_type"
DELIVERY_LIMIT_OPTION = "delivery_limit"
QUEUE_TYPES = ("classic", "quorum")
#: Deliveries of one request a quorum topic queue makes before it dead-letters it. A request
#: that kills the worker it is delivered to comes back redelivered, and flowengine workers hand
#: those back to their engine instead of running them; the limit is the broker's backstop for
#: what keeps coming back (TaskFlow peers, workers stopping over and over).
DEFAULT_DELIVERY_LIMIT = 20


@dataclasses.dataclass(frozen=True)
class QueueKind:
    """How a publisher declares its durable queues (see :func:`queue_kind`).

    Attributes:
        quorum: RabbitMQ quorum queues (replicated on a majority of the cluster's nodes) instead
            of classic ones (which live on one node and are lost with it).
        delivery_limit: Deliveries a quorum topic queue makes of one message before it moves
            it to the dead-letter queue (None: no limit).
    """

    quorum: bool = False
    delivery_limit: int | None = None


def queue_kind(url: str | None, driver: str | None, options: dict[str, Any],
               taskflow_compat: bool) -> QueueKind:
    """The queue type ``options`` ask for (transport option ``queue_type``), or the default:
    quorum queues on an AMQP broker named by several node URLs (``amqp://a;amqp://b``), classic
    queues otherwise.

    Raises:
        ValueError: An unknown queue type, a delivery limit that is not a positive integer, or
            quorum queues where they cannot be (not AMQP, or ``taskflow_compat``, whose peers
            declare the queues transient).
    """
    wanted = options.get(QUEUE_TYPE_OPTION)
    if wanted is None:
        quorum = driver == "amqp" and ";" in (url or "") and not taskflow_compat
    elif wanted in QUEUE_TYPES:
        quorum = wanted == "quorum"
    else:
        raise ValueError(f"Transport option {QUEUE_TYPE_OPTION!r} must be one of "
                         f"{', '.join(QUEUE_TYPES)}, not {wanted!r}")
    if quorum and driver != "amqp":
        raise ValueError(f"Quorum queues are RabbitMQ's (AMQP); transport {driver!r} has none "
                         f"(transport option {QUEUE_TYPE_OPTION!r})")
    if quorum and taskflow_compat:
        raise ValueError("Quorum queues cannot be used with taskflow_compat (TaskFlow peers "
                         "declare every queue non-durable and auto-deleted)")
    if not quorum:
        return QueueKind()
    limit = options.get(DELIVERY_LIMIT_OPTION, DEFAULT_DELIVERY_LIMIT)
    try:
        count = None if limit in (None, 0, "0", "none") else int(limit)
    except (TypeError, ValueError):
        count = -1
    if count is not None and count < 1:
        raise ValueError(f"Transport option {DELIVERY_LIMIT_OPTION!r} must be a whole number "
                         f"of deliveries >= 1 (0: none), not {limit!r}")
    return QueueKind(quorum=True, delivery_limit=count)


class BrokerOutage(OperationalError):
    """A publish gave up: the broker stayed unreachable past the message's deadline.

    The message names the broker (its URL masked), the message and how long it was tried.
    """


def mask_url(url: str | None) -> str:
    """``url`` with passwords replaced by ``***`` (every URL of a ``;`` failover list)."""
    return mask_urls(url or "")


class ConnectionDetails(NamedTuple):
    """Read-only facts about a proxy's broker connection (the URI has no password)."""

    uri: str
    transport: str
    driver_name: str
    driver_version: str | None
    options: dict[str, Any]


class StoredMessage(NamedTuple):
    """A message copied out of a queue: its raw body, headers and properties."""

    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any]

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body.decode("utf-8"))


@dataclasses.dataclass(frozen=True)
class BrokerTraits:
    """What a consumer and a publisher must know of their transport, decided in one place.

    Attributes:
        driver: Kombu's ``driver_type`` (``amqp``, ``redis``, ``memory``, ``beanstalk`` ...).
        settles_anywhere: Messages can be settled from any thread (kombu's virtual
            transports); otherwise only on the consumer's own.
        heartbeats: Consuming connections send heartbeats (AMQP), so a broker notices a frozen
            consumer and redelivers what it held.
        receipt_ack: Acknowledging on receipt saves work the broker does per message: kombu's
            Redis transport keeps a copy of every unacknowledged delivery in Redis (two round
            trips per message) to hand it out again if its consumer dies holding it. On AMQP,
            deliveries in flight when a connection drops come back only if unacknowledged; on
            flowengine-fs an acknowledgement is what frees the message's file.
        priorities: Queues order messages by priority: AMQP queues declared with a maximum
            priority, beanstalkd, which orders every tube by job priority, and flowengine's
            Redis, flowengine-fs and memory transports, which say so (``orders_by_priority``).
        native_delay: The broker holds a message published with header
            ``x-flowengine-delay`` until the delay ends (beanstalkd's job delay); elsewhere
            the process's broker client holds it and publishes it when due.
        declarations_are_records: Queues and bindings are records the transport keeps
            (kombu's virtual transports: Redis, beanstalkd, flowengine-fs, memory): declaring
            one that exists with other arguments is no error, and a server restarted empty
            forgets them without any client seeing an error. AMQP brokers refuse a queue
            declared again with other arguments, and keep durable declarations across a
            restart.
    """

    driver: str | None
    settles_anywhere: bool
    heartbeats: bool
    receipt_ack: bool
    priorities: bool
    native_delay: bool = False
    declarations_are_records: bool = False


def traits(transport_cls: Any) -> BrokerTraits:
    """The :class:`BrokerTraits` of a kombu transport class."""
    driver = getattr(transport_cls, "driver_type", None)
    virtual_transport = issubclass(transport_cls, virtual.Transport)
    return BrokerTraits(driver=driver, settles_anywhere=virtual_transport,
                        heartbeats=driver == "amqp", receipt_ack=driver == "redis",
                        priorities=not virtual_transport or driver == "beanstalk"
                        or getattr(transport_cls, "orders_by_priority", False),
                        native_delay=driver == "beanstalk",
                        declarations_are_records=virtual_transport)


def tune(driver: str | None, options: dict[str, Any]) -> None:
    """Set flowengine's defaults for ``driver`` (kombu's ``driver_type``) in ``options``."""
    if driver == "amqp":
        # Publisher confirms: publish() returns only once the broker has the message, so a
        # worker acknowledges a request only after its outcome is safely stored.
        options.setdefault("confirm_publish", True)
    if driver == "memory":
        # Kombu's memory transport sleeps a whole second between empty polls by default.
        options.setdefault("polling_interval", transport_fs.DEFAULT_POLLING_INTERVAL)
    if driver == "redis":
        # Redis returns a message a consumer took and never settled only after this long;
        # kombu's hour would strand the requests a killed worker had taken but not started
        # well past any transition timeout. A request still running when it comes back is
        # handed back, and its engine asks its holder for a heartbeat rather than rerun it.
        options.setdefault("visibility_timeout", REDIS_VISIBILITY_TIMEOUT)
        # Handing messages out again takes a Redis lock that expires only after this
        # (kombu: 5 minutes); a consumer killed while holding it stalls every consumer's
        # restores that long. The work under the lock takes milliseconds.
        options.setdefault("unacked_mutex_expire", REDIS_RESTORE_LOCK_EXPIRE)


#: Seconds a reachability probe waits for a TCP connection to a broker node.
PROBE_TIMEOUT = 0.5


def reachability(conn: kombu.Connection) -> Callable[[], bool] | None:
    """A cheap look at whether any node of ``conn`` accepts TCP connections again, for a
    :class:`~flowengine.worker_based.backoff.Backoff` to end a long sleep early once a broker
    that was away is back (None: the transport has no network address, such as memory or
    flowengine-fs, and is not probed).

    Only a TCP connect and close: no handshake, no credentials, nothing logged by the broker
    beyond a closed connection.
    """
    # The class's, not an instance's: making a transport may touch its resources (a folder).
    port = getattr(conn.get_transport_cls(), "default_port", None)
    nodes: list[tuple[str, int]] = []
    for url in conn.alt or [None]:
        node = conn if url is None else kombu.Connection(url)
        node_port = node.port or port
        if node.hostname and node_port:
            nodes.append((str(node.hostname), int(node_port)))
    if not nodes:
        return None

    def reachable() -> bool:
        for node in nodes:
            try:
                socket.create_connection(node, timeout=PROBE_TIMEOUT).close()
            except OSError:
                continue
            return True
        return False

    return reachable
