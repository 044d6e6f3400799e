"""flowengine's beanstalkd transport for kombu: a queue is a tube, a delivery a reserved job.

URL ``beanstalk://host:port`` (port 11300 by default); this module registers the scheme with
kombu when imported (:mod:`~.connection` imports it). Needs the ``greenstalk``
client: ``pip install 'flowengine[beanstalk]'``. Transport options: ``default_ttr`` (seconds a
job without a lease header may stay reserved unsettled, default :data:`DEFAULT_TTR`),
``polling_interval`` (seconds between polls of an empty tube, default
:data:`DEFAULT_POLLING_INTERVAL`), ``binding_cache_ttl`` (see below).

How kombu's model maps onto beanstalkd:

* Publishing puts a job on the queue's tube. The kombu envelope (body, headers, properties) is
  the job's JSON body. AMQP priority ``p`` (0..255, higher first) becomes beanstalkd priority
  ``DEFAULT_PRIORITY - p`` (lower first), so a message without one gets :data:`DEFAULT_PRIORITY`
  and urgency orders delivery within each tube. Header :data:`HEADER_DELAY` (seconds) becomes
  the job's delay (its id is kept by ``correlation_id`` for the publisher, which may delete
  it while it waits: :mod:`~.transport_beanstalk_delays`); header :data:`HEADER_LEASE`
  (seconds) its time-to-run (TTR), else ``default_ttr``.
* Consuming reserves a job (never waiting inside beanstalkd, so the consumer keeps kombu's
  drain timeout; an empty poll sleeps ``polling_interval``). The job stays reserved until the
  message is settled: ack deletes it, requeue releases it, reject deletes it. A consumer killed
  or cut off gives its jobs back when its connection closes; a frozen one when each job's TTR
  runs out, unless :meth:`Channel.touch` extends it (flowengine's worker heartbeats do). A job
  reserved before (``reserves`` > 1 in ``stats-job``) arrives marked redelivered, as AMQP marks
  it. A job whose body is not a kombu envelope is buried, logged, and the consumer carries on.
* Dead letters: a message published with flowengine's dead-letter header
  (``x-flowengine-dead-reason``) is buried on arrival, so ``stats-tube`` counts it as buried.
  Reading it (``basic_get``: an operator listing or requeueing dead letters) kicks it
  (``kick-job``) and reserves it; given back, it is buried again.
* Exchanges and bindings stay kombu's virtual ones, kept on the server so every process routes
  alike (:mod:`~flowengine.worker_based.broker.transport_beanstalk_bindings`); a process keeps what
  it read for ``binding_cache_ttl`` seconds for routing keys bound to exactly one queue
  (re-read on a miss and after it binds), and reads afresh for keys bound to several queues
  and for fanout.

Limits: messages (with kombu's envelope and base64 body, a third larger than the body) must fit
beanstalkd's ``max-job-size`` (``-z``, 65,535 bytes by default); a larger one fails to publish
with an error saying so. Tube names are at most 200 bytes of ``A-Za-z0-9-+/;.$_()``: other
characters are escaped as ``$xx`` and long names are cut and suffixed with a digest. Message
expiration is checked when a job is reserved (to the second), not by the server. Bindings of a
process killed with SIGKILL stay on the server (as on Redis); messages routed by them wait in a
tube nobody reads until the queue is deleted. Consumers poll (a blocking ``reserve`` would
hold the very connection their jobs must be settled on). TTRs are whole seconds, at least
:data:`MIN_TTR`. beanstalkd 1.12 does not always time out a job whose holder sends nothing at
all (a frozen process): its scheduler can miss that connection's deadline until the holder's
next command or disconnection, so flowengine's engines keep their own lease and never depend
on the TTR alone.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
from collections.abc import Iterable
from queue import Empty
from typing import Any, NamedTuple

import kombu.transport
from kombu.transport import virtual

from flowengine.worker_based import extensions as ext
from flowengine.worker_based.broker import transport_beanstalk_bindings as bindings
from flowengine.worker_based.broker import transport_beanstalk_delays as delays
from flowengine.worker_based.broker.transport_beanstalk_bindings import (
    FOREVER,
    tube_name,
)

try:
    import greenstalk
except ImportError:  # pragma: no cover - the extra is missing; Transport() says which
    greenstalk = None  # type: ignore[assignment]

LOG = logging.getLogger(__name__)

TRANSPORT_NAME = "beanstalk"
DEFAULT_PORT = 11300
#: beanstalkd priority of a message without one (lower is more urgent).
DEFAULT_PRIORITY = 1024
#: Highest AMQP priority honoured; ``DEFAULT_PRIORITY - MAX_PRIORITY`` is the most urgent.
MAX_PRIORITY = 255
#: Seconds a job published without :data:`HEADER_LEASE` may stay reserved without a touch.
DEFAULT_TTR = 3600
#: Shortest time-to-run: beanstalkd 1.12 hardly ever times out a job with a TTR of 1 s once
#: its holder has sent another command (here: the ``stats-job`` after every reserve).
MIN_TTR = 2
#: Seconds between polls of empty tubes.
DEFAULT_POLLING_INTERVAL = 0.005
#: Seconds a command may take before the connection counts as lost.
SOCKET_TIMEOUT = 10.0
#: Request header: seconds the job may stay reserved without a touch (its TTR).
HEADER_LEASE = ext.HEADER_LEASE
#: Message header: seconds before the job becomes ready (beanstalkd's delay).
HEADER_DELAY = ext.HEADER_DELAY
#: What a lost connection raises (greenstalk asserts on a reply cut short).
_LOST = (OSError, AssertionError)

kombu.transport.TRANSPORT_ALIASES.setdefault(TRANSPORT_NAME, f"{__name__}:Transport")


def beanstalk_priority(priority: Any) -> int:
    """beanstalkd priority for AMQP ``priority`` (higher first -> lower first)."""
    try:
        level = max(0, min(int(priority), MAX_PRIORITY))
    except (TypeError, ValueError):
        level = 0
    return DEFAULT_PRIORITY - level


def _seconds(value: Any, default: int = 0) -> int:
    """Whole seconds (rounded up) for a header value; ``default`` if it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return default
    return min(math.ceil(value), FOREVER)


class _Held(NamedTuple):
    """A reserved job delivered and not settled yet."""

    job_id: int
    priority: int
    buried: bool  # taken out of the buried list: given back, it is buried again


class QoS(virtual.QoS):
    """Settles reserved jobs: ack deletes, requeue releases (or buries again), close releases."""

    def ack(self, delivery_tag: str) -> None:
        try:
            self.channel.settle(delivery_tag, requeue=False)
        finally:  # settled or not, the slot is free: a lost job is beanstalkd's again
            super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            self.channel.settle(delivery_tag, requeue=requeue)
        finally:
            self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Any]:
        self._flush()
        try:
            for delivery_tag in list(self._delivered):
                self.channel.settle(delivery_tag, requeue=True)
        except _LOST as err:
            # beanstalkd gives a closed connection's reserved jobs back by itself.
            LOG.debug("beanstalk: could not release held jobs: %s", err)
        self._delivered.clear()
        return []


class Channel(bindings.ServerBindings):
    """A virtual channel over one beanstalkd connection (every command under one lock)."""

    QoS = QoS
    supports_fanout = True
    from_transport_options = virtual.Channel.from_transport_options + (  # type: ignore[assignment]
        "default_ttr", "binding_cache_ttl")
    default_ttr: float = DEFAULT_TTR

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        client = connection.client
        self._address = (client.hostname or "127.0.0.1", int(client.port or DEFAULT_PORT))
        self._lock = threading.RLock()
        self._using = "default"
        self._watching: frozenset[str] = frozenset({"default"})
        self._held: dict[str, _Held] = {}
        # job id -> the tag of its latest delivery here: a job whose TTR ran out can come back
        # to the same connection, and only its latest delivery may settle it.
        self._latest: dict[int, str] = {}
        self._bindings: dict[str, tuple[str, str, str, str]] = {}  # binding tube -> binding
        self._routes: dict[str, tuple[float, list[tuple[str, str, str]]]] = {}
        # Set when a settlement finds the connection gone: a consumer whose prefetch is full
        # sends nothing else, and would never notice (see drain_events).
        self._lost: str | None = None
        self._client = self._connect(client.connect_timeout or SOCKET_TIMEOUT)

    def _connect(self, timeout: float) -> Any:
        sock = socket.create_connection(self._address, timeout=timeout)
        sock.settimeout(SOCKET_TIMEOUT)
        return greenstalk.Client(sock, encoding=None)

    # -- the connection's tube state --------------------------------------------------------

    def _use(self, tube: str) -> None:
        if tube != self._using:
            self._client.use(tube)
            self._using = tube

    def _watch(self, tubes: Iterable[str]) -> None:
        wanted = frozenset(tubes)
        if wanted == self._watching or not wanted:
            return
        for tube in wanted - self._watching:
            self._client.watch(tube)
        for tube in self._watching - wanted:
            self._client.ignore(tube)
        self._watching = wanted

    # -- publishing -------------------------------------------------------------------------

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        headers = message.get("headers") or {}
        priority = beanstalk_priority(message["properties"].get("priority"))
        delay = _seconds(headers.get(HEADER_DELAY))
        ttr = max(_seconds(headers.get(HEADER_LEASE), _seconds(self.default_ttr, DEFAULT_TTR)),
                  MIN_TTR)
        body = json.dumps(message).encode()
        tube = tube_name(queue)
        with self._lock:
            self._use(tube)
            try:
                job_id = self._client.put(body, priority=priority, delay=delay, ttr=ttr)
            except greenstalk.JobTooBigError as err:
                raise greenstalk.JobTooBigError(
                    f"beanstalkd refused a {len(body)} byte job for queue {queue!r} (tube "
                    f"{tube!r}): over its max-job-size (beanstalkd -z)") from err
            if ext.HEADER_DEAD_REASON in headers:
                self._client.bury(self._client.reserve_job(job_id), priority)
        correlation_id = message["properties"].get("correlation_id")
        if delay and correlation_id:
            # Its publisher may have to take it back while it waits (an engine suspending).
            delays.record(str(correlation_id), self._address, job_id)

    def _put_fanout(self, exchange: str, message: Any, routing_key: str, **kwargs: Any) -> None:
        for queue in {queue for _, _, queue in self._read_table(exchange)}:
            self._put(queue, message, **kwargs)

    # -- consuming --------------------------------------------------------------------------

    def _get_many(self, queues: list[str], timeout: float | None = None) -> None:
        tubes = {tube_name(queue): queue for queue in queues}
        with self._lock:
            self._watch(tubes)
            job = self._reserve()
            payload = self._accept(job)
        if payload is None:
            raise Empty()
        queue = tubes.get(payload.pop("x-beanstalk-tube", ""), "")
        self.connection._deliver(payload, queue or queues[0])

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        tube = tube_name(queue)
        with self._lock:
            self._watch([tube])
            try:
                job = self._reserve()
                buried = False
            except Empty:
                job, buried = self._unbury(tube), True
            payload = self._accept(job, buried)
        if payload is None:
            raise Empty()
        payload.pop("x-beanstalk-tube", None)
        return payload

    def _reserve(self) -> Any:
        try:
            return self._client.reserve(timeout=0)
        except (greenstalk.TimedOutError, greenstalk.DeadlineSoonError):
            raise Empty() from None

    def _unbury(self, tube: str) -> Any:
        """Kick the tube's oldest buried job and reserve it (raise Empty if there is none)."""
        self._use(tube)
        try:
            found = self._client.peek_buried()
            self._client.kick_job(found.id)
            return self._client.reserve_job(found.id)
        except greenstalk.NotFoundError:  # none, or another reader took it meanwhile
            raise Empty() from None

    def _accept(self, job: Any, buried: bool = False) -> dict[str, Any] | None:
        """The envelope of a reserved job, recorded as held; None if it was dropped."""
        stats = self._client.stats_job(job.id)
        try:
            payload = json.loads(job.body)
            self.Message(payload, channel=self)  # proves the envelope and body decode
        except Exception as err:
            self._client.bury(job, stats["pri"])
            LOG.warning("beanstalk: buried undecodable job %s of tube %r: reason=decode-error "
                        "%s: %s", job.id, stats["tube"], type(err).__name__, str(err)[:200])
            return None
        properties = payload["properties"]
        expiration = properties.get("expiration")
        if expiration is not None and not buried:
            try:
                expired = stats["age"] - stats["delay"] > float(expiration) / 1000.0
            except (TypeError, ValueError):
                expired = False
            if expired:
                self._client.delete(job.id)
                return None
        tag = f"{job.id}.{stats['reserves']}"
        properties["delivery_tag"] = tag
        if stats["reserves"] > 1 and not buried:
            properties.setdefault("delivery_info", {})["redelivered"] = True
        payload["x-beanstalk-tube"] = stats["tube"]
        self._held[tag] = _Held(job.id, stats["pri"], buried)
        self._latest[job.id] = tag
        return payload

    def drain_events(self, timeout: float | None = None, callback: Any = None) -> Any:
        if self._lost is not None:
            raise ConnectionError(f"beanstalk connection to {self._address} lost: {self._lost}")
        return super().drain_events(timeout=timeout, callback=callback)

    def _on_held(self, what: str, job_id: int, command: Any, *args: Any) -> bool:
        """Run ``command`` on a job this connection reserved; False if it is not reserved here
        any more (its TTR ran out: beanstalkd has it back)."""
        try:
            with self._lock:
                command(*args)
        except greenstalk.NotFoundError:
            LOG.debug("beanstalk: could not %s job %s: no longer reserved here", what, job_id)
            return False
        except _LOST as err:
            self._lost = f"{type(err).__name__}: {err}"
            raise
        return True

    def settle(self, delivery_tag: str, requeue: bool) -> None:
        """Delete (or give back) the reserved job behind ``delivery_tag``."""
        held = self._held.pop(delivery_tag, None)
        if held is None or self._client is None:
            return
        if self._latest.get(held.job_id) != delivery_tag:
            return  # delivered here again since: the job is no longer this delivery's
        del self._latest[held.job_id]
        client, job = self._client, greenstalk.Job(held.job_id, b"")
        if not requeue:
            self._on_held("delete", held.job_id, client.delete, held.job_id)
        elif held.buried:
            self._on_held("bury", held.job_id, client.bury, job, held.priority)
        else:
            self._on_held("release", held.job_id, client.release, job, held.priority)

    def touch(self, delivery_tag: str) -> bool:
        """Restart the TTR of the reserved job behind ``delivery_tag``; False if it is not held
        here any more (settled, or its TTR ran out and beanstalkd took it back)."""
        held = self._held.get(delivery_tag)
        if held is None or self._client is None or self._latest.get(held.job_id) != delivery_tag:
            return False
        return self._on_held("touch", held.job_id, self._client.touch,
                             greenstalk.Job(held.job_id, b""))

    # -- queues -----------------------------------------------------------------------------

    def _size(self, queue: str) -> int:
        with self._lock:
            try:
                return int(self._client.stats_tube(tube_name(queue))["current-jobs-ready"])
            except greenstalk.NotFoundError:  # a tube exists only while in use
                return 0

    def _purge(self, queue: str) -> int:
        return self._drop(tube_name(queue), ("peek_ready",))

    def _drop(self, tube: str, peeks: Iterable[str]) -> int:
        count = 0
        with self._lock:
            self._use(tube)
            for peek in peeks:
                while True:
                    try:
                        self._client.delete(getattr(self._client, peek)().id)
                    except greenstalk.NotFoundError:
                        break
                    count += 1
            self._use("default")  # a tube lives while used: let an emptied one go
        return count

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False,
                     **kwargs: Any) -> None:
        if if_empty and self._size(queue):
            return
        super().queue_delete(queue, if_unused=if_unused, if_empty=if_empty, **kwargs)
        # Bindings other processes made for it too, and every job not reserved.
        for tube, binding in self._all_bindings().items():
            if binding[3] == queue:
                self._unbind(tube)
        self._drop(tube_name(queue), ("peek_ready", "peek_delayed", "peek_buried"))

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        exchange, routing_key, pattern = (list(args) + [None, None, None])[:3]
        if exchange:
            self._unbind(bindings.binding_tube(exchange, routing_key or "", pattern or "", queue))

    def queue_stats(self, queue: str) -> dict[str, int]:
        """``stats-tube`` of ``queue``'s tube: jobs ready, reserved, delayed and buried, and the
        connections watching it (its consumers); all 0 when the tube does not exist."""
        with self._lock:
            stats = self._stats(tube_name(queue)) or {}
        return {key: int(stats.get(f"current-{field}", 0)) for key, field in (
            ("ready", "jobs-ready"), ("reserved", "jobs-reserved"), ("delayed", "jobs-delayed"),
            ("buried", "jobs-buried"), ("watching", "watching"))}

    def close(self) -> None:
        super().close()  # gives back what is still held (QoS.restore_unacked)
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except OSError:
                pass


class Transport(virtual.Transport):
    """The ``beanstalk`` kombu transport."""

    Channel = Channel
    polling_interval = DEFAULT_POLLING_INTERVAL
    default_port = DEFAULT_PORT  # type: ignore[assignment]
    driver_type = TRANSPORT_NAME
    driver_name = "greenstalk"
    connection_errors = virtual.Transport.connection_errors + _LOST  # type: ignore[assignment]
    channel_errors = virtual.Transport.channel_errors + (  # type: ignore[assignment]
        (greenstalk.UnknownResponseError, greenstalk.InternalError,
         greenstalk.OutOfMemoryError, greenstalk.DrainingError) if greenstalk else ())
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic", "fanout"]))

    def __init__(self, client: Any, **kwargs: Any) -> None:
        if greenstalk is None:
            raise ImportError("The beanstalk transport needs the greenstalk package: "
                              "pip install 'flowengine[beanstalk]'")
        super().__init__(client, **kwargs)

    def driver_version(self) -> str:
        return str(greenstalk.__version__)
