"""flowengine's Redis transport for kombu: kombu's own, minus two costs it pays on every message.

Kombu's Redis channel builds a new ``redis.Redis`` client (and its table of response callbacks)
for every command outside the consume loop: every publish, every ack, every delivery's unacked
bookkeeping. It also reads the exchange's binding table (``SMEMBERS _kombu.binding.<exchange>``)
before every publish to a direct exchange, to find the queue the routing key names. Together that
was about a third of an engine's and a worker's CPU per remote task. This channel:

* keeps one client over the channel's connection pool for those commands. A ``redis.Redis``
  client over a ``ConnectionPool`` takes a pooled connection per command (pipelines and
  transactions take their own), so one client is safe to share between the threads that publish
  and settle on a channel (:class:`~.proxy.Proxy` settles deliveries of
  virtual transports from task threads). When the channel drops its pool (a reconnect, a fork)
  the next command builds a client over the new one.
* routes a direct exchange's messages by a copy of its binding table that is re-read when it is
  older than :data:`BINDING_CACHE_TTL` seconds (transport option ``binding_cache_ttl``; 0 reads
  it every time, as kombu does), when the routing key has no queue in the copy, and after this
  channel binds or deletes a queue of that exchange. A routing key bound to several queues is
  looked up afresh on every publish, as kombu does.

What the copy can get wrong, for at most ``binding_cache_ttl`` seconds after another channel or
process changed the bindings:

* A queue bound to a routing key that already had exactly one queue is missed: messages go to
  the first queue only. flowengine's topology never does this: a worker topic's queue
  ``<exchange>_<topic>`` and an engine's reply queue ``<exchange>_<engine uuid>`` are each the
  only queue on their key, and the keys several queues share (discovery, control) are always
  looked up afresh.
* A deleted queue still receives: a message routed to it is pushed onto a Redis list nobody reads
  (kombu would have dropped it as undeliverable). In flowengine this is a reply that reaches an
  engine within that window after the engine deleted its reply queue: the engine had stopped
  waiting for it, and the stray list stays in Redis until removed.

It also reads message priority as AMQP does, highest first
(see :meth:`Channel._get_message_priority`).

A queue consumed without acknowledgements (an engine process's reply queue) is read in batches:
once a blocking ``BRPOP`` returns a message, the channel takes what else waits in the same list
with one ``RPOP key count`` (at most :data:`BATCH_READ`, transport option ``batch_read``; 0 reads
one message per ``BRPOP``, as kombu does) and delivers them in order. Kombu's loop pays a command
sent, a poll and a read for every message, and each of those three releases the GIL and waits to
take it back: in a process where a thousand engines are stepping, that wait, not Redis, set how
fast replies were read (measured on 1,000 concurrent 3-task flows: 375 tasks/s read one by one,
470 in batches, the engine process's CPU per task down by a fifth; see ``doc/performance.rst``).
Queues consumed with acknowledgements (a worker's topic) are left alone: a batch would take more
than the consumer's prefetch from the workers sharing the queue. A server older than Redis 6.2
(``RPOP`` without a count) is read one message at a time.

``redis://`` and ``rediss://`` URLs (and ``transport="redis"``) get this transport only through
:func:`lean`, which flowengine's :class:`~.proxy.Proxy` and
:class:`~.broadcast.Broadcast` call; kombu's alias table is left alone, so
other kombu users in the process keep kombu's stock transport. Redis Sentinel URLs
(``sentinel://host:26379;sentinel://host2:26379``, every Sentinel of the group, with transport
option ``master_name``) get :class:`SentinelTransport`, the same channel over kombu's Sentinel
one: each new connection asks the Sentinels which server is the master now, so after a failover
consumers and publishers reconnect to the promoted replica. Unix socket (``redis+socket://``)
URLs keep kombu's transport, as does a connection that failed over to the next URL of a ``;``
list of ``redis://`` URLs (kombu resolves that URL's scheme again).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection
from queue import Empty
from typing import Any

import kombu

try:
    # Kombu's module needs both, and without the client fails with an AttributeError.
    import packaging  # noqa: F401
    import redis  # noqa: F401
    from kombu.transport import redis as kombu_redis
    from kombu.utils.encoding import bytes_to_str
    from kombu.utils.json import loads
    from redis.exceptions import ResponseError
except ImportError as err:
    raise ImportError(f"The Redis transport needs the 'redis' extra: "
                      f"pip install 'flowengine[redis]' ({err})") from err

LOG = logging.getLogger(__name__)

#: Seconds a channel routes by its copy of an exchange's binding table before reading it again.
BINDING_CACHE_TTL = 1.0
#: Most messages one read takes from a list consumed without acknowledgements, beyond the one
#: the blocking pop returned (each is handled on the consumer's thread before the next poll).
BATCH_READ = 64
#: The transport names (URL schemes) :func:`lean` replaces.
STOCK_NAMES = frozenset({"redis", "rediss", "sentinel"})

# (deadline on the channel's clock, routing key -> the queues bound with it)
_Routes = tuple[float, dict[str, frozenset[str]]]


class Channel(kombu_redis.Channel):
    """Kombu's Redis channel with one shared command client and a cached binding table."""

    # kombu's option tuple is inferred with a fixed length.
    from_transport_options = kombu_redis.Channel.from_transport_options + (  # type: ignore[assignment]
        "binding_cache_ttl", "batch_read")
    binding_cache_ttl: float = BINDING_CACHE_TTL
    batch_read: int = BATCH_READ
    #: Monotonic clock of the binding cache (tests replace it on an instance).
    clock: Callable[[], float] = staticmethod(time.monotonic)
    _command_client: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before kombu's __init__, which already talks to Redis.
        self._routes: dict[str, _Routes] = {}
        #: The queues consumed without acknowledgements: read in batches (see _brpop_read).
        self._unacked_queues: set[str] = set()
        super().__init__(*args, **kwargs)

    # -- one client for the commands outside the consume loop -------------------------------

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the consume loop's BRPOP/LISTEN client: kombu caches it already
            return super()._create_client(asynchronous=True)
        client = self._command_client
        # The pool property builds a new pool after _disconnect_pools() dropped the old one.
        if client is None or client.connection_pool is not self.pool:
            client = self._command_client = super()._create_client()
        return client

    def conn_or_acquire(  # type: ignore[override]  # kombu's callers only enter it
            self, client: Any = None) -> contextlib.AbstractContextManager[Any]:
        # Called for every command: a plain context manager costs less than kombu's generator.
        return contextlib.nullcontext(client if client else self._create_client())

    # -- reading queues without acknowledgements in batches --------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        """Consume ``queue`` (kombu's); remember whether it is read in batches."""
        if no_ack:
            self._unacked_queues.add(queue)
        else:
            self._unacked_queues.discard(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        """Stop a consumer (kombu's); its queue is no longer read in batches."""
        queue = self._tag_to_queue.get(consumer_tag)
        if queue is not None:
            self._unacked_queues.discard(queue)
        return super().basic_cancel(consumer_tag)

    def _brpop_read(self, **options: Any) -> bool:
        """Deliver the message the blocking pop returned, and with it, if its queue is
        consumed without acknowledgements, what else waits in the same list (one ``RPOP``
        with a count). Replaces kombu's read, which delivers one message per poll."""
        client = self.client
        connection = client.connection
        try:
            try:
                popped = client.parse_response(connection, "BRPOP", **options)
            except self.connection_errors:
                connection.disconnect()  # the next poll connects again
                raise
            if not popped:
                raise Empty()
            key, payload = popped
            key = bytes_to_str(key)
            queue = key.rsplit(self.sep, 1)[0]  # the priority lists are <queue><sep><step>
            self._queue_cycle.rotate(queue)
            self.connection._deliver(loads(bytes_to_str(payload)), queue)
            if queue in self._unacked_queues and self.batch_read > 0:
                self._deliver_waiting(client, connection, key, queue)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # kombu: the polled connection or None
            # kombu sends a pending re-authentication here, while the connection is idle.
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _deliver_waiting(self, client: Any, connection: Any, key: str, queue: str) -> None:
        """Take up to :attr:`batch_read` more messages from list ``key`` and deliver them
        to ``queue``'s consumer in order; any the consumer did not take go back."""
        command = ["RPOP", key, int(self.batch_read)]
        if self.global_keyprefix:
            command = client._prefix_args(command)
        connection.send_command(*command)
        try:
            waiting = client.parse_response(connection, "RPOP") or []
        except ResponseError as err:  # Redis before 6.2: RPOP takes no count
            LOG.info("Redis refused RPOP with a count (%s): queue %s is read one message at a "
                     "time", err, queue)
            self.batch_read = 0
            return
        for index, payload in enumerate(waiting):
            try:
                self.connection._deliver(loads(bytes_to_str(payload)), queue)
            except BaseException:
                self._give_back(key, queue, waiting[index + 1:])
                raise

    def _give_back(self, key: str, queue: str, payloads: list[Any]) -> None:
        """Put ``payloads`` (taken, not delivered) back at the tail of ``key``, first to be
        read first; a consumer whose callback failed must not lose the rest of a batch."""
        if not payloads:
            return
        try:
            # RPUSH appends in order: the last one pushed is the next RPOP/BRPOP.
            self._create_client().rpush(key, *reversed(payloads))
        except Exception:
            LOG.exception("Could not put %d messages back on queue %s after its consumer "
                          "failed: they are lost", len(payloads), queue)

    # -- what the broker still holds --------------------------------------------------------

    def held(self, queue: str, needles: Collection[str], limit: int) -> set[str] | None:
        """Which of ``needles`` (request ids) a message waiting in ``queue`` (any of its
        priority lists) or delivered and not yet settled (kombu's unacked hash, every
        queue's) holds; None if the queue is longer than ``limit``: too long to read."""
        client = self._create_client()
        keys = list(dict.fromkeys(self._q_for_pri(queue, pri) for pri in self.priority_steps))
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.llen(key)
            pipe.hlen(self.unacked_key)
            lengths = pipe.execute()
        if sum(lengths) > limit:
            return None
        # kombu's key prefix client prefixes LLEN and HLEN, not LRANGE and HVALS.
        prefix = self.global_keyprefix or ""
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lrange(prefix + key, 0, -1)
            pipe.hvals(prefix + self.unacked_key)
            stored = [entry if isinstance(entry, bytes) else entry.encode()
                      for entries in pipe.execute() for entry in entries]
        return {needle for needle in needles
                if any(needle.encode() in entry for entry in stored)}

    # -- priorities ---------------------------------------------------------------------------

    def _get_message_priority(self, message: Any, reverse: bool = False) -> int:
        """The message's priority as kombu's Redis lists order it: lowest first, so AMQP's 9
        (the most urgent) becomes 0. kombu pushes a message onto the list of the highest of its
        ``priority_steps`` (default 0, 3, 6, 9) not above that number and pops the lists in step
        order (doc/priorities.rst lists the levels this gives)."""
        return int(super()._get_message_priority(message, reverse=not reverse))

    # -- routing by a copy of the binding table ---------------------------------------------

    def get_table(self, exchange: str) -> list[tuple[str, ...]]:
        """The exchange's bindings, read from Redis (and kept as this channel's routing copy)."""
        table = super().get_table(exchange)
        routes: dict[str, set[str]] = {}
        for routing_key, _pattern, queue in table:
            routes.setdefault(routing_key, set()).add(queue)
        # One assignment of an immutable snapshot: threads that settle on this channel (a
        # requeue routes its message again) read it without a lock.
        self._routes[exchange] = (self.clock() + float(self.binding_cache_ttl),
                                  {key: frozenset(queues) for key, queues in routes.items()})
        return table

    def _lookup(self, exchange: str, routing_key: str, default: str | None = None) -> Any:
        if exchange and self.typeof(exchange).type == "direct":
            cached = self._routes.get(exchange)
            if cached is not None and self.clock() < cached[0]:
                queues = cached[1].get(routing_key)
                if queues is not None and len(queues) == 1:
                    return queues
        # Missing, stale, unknown key or shared key: kombu's lookup, through get_table above.
        return super()._lookup(exchange, routing_key, default)

    def queues(self, prefix: str = "") -> list[str]:
        """The queues bound to any exchange (kombu's binding sets) whose names start with
        ``prefix``: what ``flowengine topics`` lists, and where an engine that finds no worker
        looks for its topics on other exchanges."""
        pattern = self.keyprefix_queue % "*"
        head = len(self.global_keyprefix) + len(pattern) - 1
        names: set[str] = set()
        for key in self._create_client().scan_iter(match=self.global_keyprefix + pattern,
                                                     count=500):
            exchange = (key.decode() if isinstance(key, bytes) else str(key))[head:]
            names.update(queue for _key, _pattern, queue in self.get_table(exchange))
        return sorted(name for name in names if name.startswith(prefix))

    def queue_bind(self, queue: str, exchange: str | None = None, routing_key: str = "",
                   arguments: Any = None, **kwargs: Any) -> None:
        """Bind ``queue``, in Redis, also when this connection bound it before.

        Kombu's channel remembers the bindings its connection declared and skips declaring one
        again. A Redis server restarted without its data (or a replica promoted without the
        binding) forgets it, and the command client reconnects without an error anyone sees,
        so a consumer's periodic declaration (meant to heal exactly that) never wrote the
        binding again: its topic's messages were dropped unrouted. One binding written again
        costs one pipelined round trip (two ``SADD``), as often as the consumer declares.
        """
        exchange = exchange or "amq.direct"
        if not self.state.has_binding(queue, exchange, routing_key):
            super().queue_bind(queue, exchange, routing_key, arguments, **kwargs)
            return
        self._queue_bind(exchange, *self.typeof(exchange).prepare_bind(
            queue, exchange, routing_key, arguments))

    def _queue_bind(self, exchange: str, routing_key: str, pattern: Any, queue: str) -> None:
        self._routes.pop(exchange, None)
        super()._queue_bind(exchange, routing_key, pattern, queue)

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: Any, *args: Any,
                **kwargs: Any) -> None:
        self._routes.pop(exchange, None)
        super()._delete(queue, exchange, routing_key, pattern, *args, **kwargs)


class Transport(kombu_redis.Transport):
    """Kombu's Redis transport with :class:`Channel` (same ``driver_type``: ``redis``)."""

    Channel = Channel
    #: Message priority orders delivery (see :meth:`Channel._get_message_priority`).
    orders_by_priority = True


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """:class:`Channel` on kombu's Sentinel channel (which finds the master through Sentinels)."""

    from_transport_options = Channel.from_transport_options + (  # type: ignore[assignment]
        "master_name", "min_other_sentinels", "sentinel_kwargs", "sentinel_fanout_compat")


class SentinelTransport(Transport):
    """:class:`Transport` for a master found through Redis Sentinels (``sentinel://`` URLs)."""

    Channel = SentinelChannel
    default_port = 26379  # type: ignore[assignment]  # kombu declares None


#: The transports :func:`lean` puts in place of kombu's, by transport name (URL scheme).
_LEAN = {"redis": Transport, "rediss": Transport, "sentinel": SentinelTransport}


def lean(conn: kombu.Connection) -> kombu.Connection:
    """``conn`` on :class:`Transport` if kombu would use its stock Redis transport, else ``conn``.

    A clone keeps everything kombu took from the URL (host, port, database, password, the TLS
    settings a ``rediss://`` URL implies, ``;`` alternates) and shares ``conn``'s
    ``transport_options`` dict. Its ``as_uri()`` names the class instead of the scheme, so take
    URIs for display from ``conn``.
    """
    lean_transport = _LEAN.get(conn.transport_cls) if isinstance(conn.transport_cls, str) else None
    if lean_transport is not None and not conn.uri_prefix:
        return conn.clone(transport=lean_transport)
    return conn
