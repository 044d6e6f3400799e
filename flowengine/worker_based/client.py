"""The process-wide broker client every worker-based engine of a process shares.

One :class:`Client` per broker (URL, transport and its options, exchange, topology, retry
policy), created on first use by :func:`client_for`: one set of publishing connections, ONE
reply queue ``<exchange>_<client uuid>`` with one consumer thread for the whole process, one
warm record of the workers heard from, one thread that sends requests waiting for a worker,
one heap of delayed requests held until due
(:mod:`~flowengine.worker_based.engine_side.held_publishes`), one outbox of the events the
process publishes (:mod:`~flowengine.worker_based.event_outbox`).
Engines (their :class:`~flowengine.worker_based.executor.WorkerTaskExecutor`) are thin views
on it: each attaches while it runs, and replies reach it by their ``correlation_id`` (the
attempt's request id, unique per process). The wire format is TaskFlow's: a request's
``reply_to`` is the routing key of the process's reply queue, which is all a TaskFlow worker
needs to answer it.

A client with no view attached lingers :data:`LINGER` seconds, so engines created one after
another find it warm, then closes. :func:`close_all` closes every client (it runs at
interpreter exit); a forked child starts with none and builds its own.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from flowengine import exceptions as exc
from flowengine.types.failure import Failure
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import event_outbox as eo
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import remote_control as rc
from flowengine.worker_based.broker import broadcast as bcast
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker.delivery import Delivery
from flowengine.worker_based.broker_spec import Broker
from flowengine.worker_based.engine_side import held_publishes as hp
from flowengine.worker_based.types import TopicWorker, header, protocol_version

LOG = logging.getLogger(__name__)

#: Seconds the process's reply queue survives unused on brokers with queue expiry (AMQP).
REPLY_QUEUE_EXPIRES = ext.REPLY_QUEUE_EXPIRES
#: Seconds :meth:`Client.attach` waits for the reply consumer to be consuming.
CONSUMER_START_TIMEOUT = 30.0
#: Seconds between the views' housekeeping passes (expiries, leases, lost workers).
HOUSEKEEPING_PERIOD = 0.1
#: Most views one pass looks at (with more, each is looked at every few passes).
HOUSEKEEPING_BATCH = 500
#: Seconds between NOTIFY rounds (how TaskFlow workers stay known; flowengine workers also
#: announce themselves).
NOTIFY_PERIOD = pr.NOTIFY_PERIOD
#: Fewest seconds between two discovery rounds an attaching view asks for: the answers to one
#: round reach every view, so a thousand engines starting at once cost one round.
MIN_ROUND_GAP = 0.5
#: Seconds a worker heard from stays known to views attaching later without hearing it again.
RECENT = 2 * NOTIFY_PERIOD + 1.0
#: Seconds a client with no view attached stays open (warm) before it closes.
LINGER = 5.0
#: Seconds between looks at whether the broker still holds the requests sent and not taken
#: yet, where it can lose one a worker took (see
#: :meth:`~flowengine.worker_based.broker.publisher.Publisher.held`: kombu's Redis transport
#: records a delivery apart from taking it off the queue, so a worker killed in between loses
#: the request, which no lease covers); also how long a request is sent before it is looked for.
HELD_CHECK_PERIOD = 5.0
#: Looks in a row that must miss a request before it is judged lost (one look can fall between
#: a worker taking it and recording it).
HELD_MISSES = 2
#: Publishing connections of a client: a publish takes well under a millisecond, so a few
#: serve a process's every engine, and sockets stay bounded whatever the number of flows.
PUBLISHERS = 4


class ClientClosed(Exception):
    """The client closed (or is closing) while a view tried to attach: get a new one."""


class View(Protocol):
    """What the client needs of an engine's executor."""

    def on_reply(self, data: Any, message: Delivery) -> None:
        """A RESPONSE for one of its attempts."""

    def on_notify(self, data: Any, message: Delivery) -> None:
        """A worker announcement or NOTIFY reply."""

    def on_wait(self) -> None:
        """Housekeeping: expiries, leases, lost workers."""

    def dispatch_waiting(self) -> None:
        """Publish requests that wait for a worker (a worker appeared)."""

    def resumed(self, outage: float) -> None:
        """The client reconnected after ``outage`` seconds without its broker."""

    def unheld_suspects(self) -> list[tuple[str, str]]:
        """Its requests sent at least :data:`HELD_CHECK_PERIOD` ago that no worker said it
        runs, as ``(request id, topic)``."""

    def unheld(self, request_id: str, why: str) -> None:
        """The broker no longer holds request ``request_id`` (:data:`HELD_MISSES` looks)."""

    def worker_silenced(self, identity: str) -> None:
        """Another engine of the process found worker ``identity`` silent (see
        :meth:`Client.silenced`): send it nothing until it is heard from again."""

    def worker_heard(self, identity: str) -> None:
        """Another engine of the process heard from worker ``identity``, silent until then
        (see :meth:`Client.heard_again`): it may be sent work again."""


class QuietView:
    """A :class:`View` that sends no requests: it only hears worker announcements.

    Args:
        on_notify: Called with each announcement (a NOTIFY reply) the client routes to it.
    """

    def __init__(self, on_notify: Callable[[Any, Delivery], None]) -> None:
        self.on_notify = on_notify

    def on_reply(self, data: Any, message: Delivery) -> None:
        """No request was sent: there is no reply to take."""

    def on_wait(self) -> None:
        """Nothing to look after between drains."""

    def dispatch_waiting(self) -> None:
        """Nothing waits for a worker."""

    def resumed(self, outage: float) -> None:
        """No lease to spare: nothing was sent."""

    def unheld_suspects(self) -> list[tuple[str, str]]:
        """Never a suspect: nothing was sent."""
        return []

    def unheld(self, request_id: str, why: str) -> None:
        """Never a suspect: nothing was sent."""

    def worker_silenced(self, identity: str) -> None:
        """Nothing is sent: nothing to hold back."""

    def worker_heard(self, identity: str) -> None:
        """Nothing is sent: nothing to send again."""


class Client:
    """One broker's reply queue, publishers and known workers, shared by a process's engines.

    Use :func:`client_for`; engines attach a view while they run.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.uuid = uuid.uuid4().hex
        # A forked child must not use its parent's client (see usable).
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._views: dict[int, View] = {}
        self._routes: dict[str, View] = {}
        #: How to suspend (or cancel) each flow an engine of this process runs
        #: (remote_control): called with the message's action.
        self._suspenders: dict[str, Callable[[str], None]] = {}
        self._topics: dict[str, int] = {}
        self._asked: set[str] = set()
        self._known: dict[str, tuple[float, TopicWorker]] = {}
        self._next_round = 0.0
        self._next_housekeeping = 0.0
        self._idle_since: float | None = None
        self._closed = False
        self._retired = False
        #: Blocks using the client without a view (see :func:`borrowed`): it stays open.
        self._borrowers = 0
        self._timer_pending = False
        self._cursor = 0
        # Whether the broker can lose a request a worker took (None: not known yet), when to
        # look next, the looks in a row that missed each request, and whether one is under way.
        self._loses_takes: bool | None = None
        self._next_held_check = 0.0
        self._misses: dict[str, int] = {}
        self._looking = False
        #: The last look's finding, not judged yet: the reply consumer's idle drains when the
        #: look ended, and the requests the broker did not hold then.
        self._unjudged: tuple[int, set[str]] | None = None
        #: How many times the broker was asked which of the views' requests it still holds.
        self.looks = 0
        self._thread: threading.Thread | None = None
        self._consumer_error: Exception | None = None
        #: Delayed requests held until due where the broker has no delays of its own.
        self.held = hp.HeldPublishes()
        self._events: eo.EventOutbox | None = None
        # Requests waiting for a worker are sent from here, not from the consumer thread that
        # learns of the worker: a burst of publishes there would hold up every reply.
        self._dispatcher = cf.ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="flowengine-dispatch")
        handlers = {
            pr.RESPONSE: dp.Handler(self._on_response, pr.Response.validate),
            pr.NOTIFY: dp.Handler(self._on_notify,
                                  functools.partial(pr.Notify.validate, response=True)),
            rc.SUSPEND: dp.Handler(self._on_suspend, rc.Suspend.validate),
        }
        self.proxy = broker.consumer(
            self.uuid, handlers, on_wait=self._housekeeping,
            extra_routing_keys=[pr.DISCOVERY_ROUTING_KEY], on_connected=self._on_connected,
            queue_expires=None if broker.taskflow_compat else REPLY_QUEUE_EXPIRES,
            # Replies are acknowledged on receipt and useless to any other process.
            auto_ack=True, publishers=PUBLISHERS, on_refused=self._on_refused,
        )
        # On flowengine-fs a full or read-only data folder is this broker's outage.
        self._disk = self.proxy.disk_watch()

    @property
    def reply_to(self) -> str:
        """The routing key replies to this process's requests go to."""
        return self.uuid

    @property
    def usable(self) -> bool:
        """Whether this client still serves this process: not closed or retired, and not
        inherited across a fork (a child builds its own: :func:`client_for`)."""
        return not (self._closed or self._retired or self.inherited)

    @property
    def inherited(self) -> bool:
        """Whether this client is a forked child's copy of its parent's (never used there)."""
        return self._pid != os.getpid()

    def event_outbox(self, maxsize: int = eo.DEFAULT_QUEUE_SIZE) -> eo.EventOutbox:
        """The outbox of the events this process publishes on this broker (made on first use,
        sized by the first caller), which closes with the client: an event put once it has
        closed raises :class:`ClientClosed` (the broker's next client takes it)."""
        outbox = self._events
        if outbox is None:
            with self._lock:
                if self._events is None:
                    broker = self.broker
                    broadcast = bcast.Broadcast(
                        eo.events_exchange(broker.exchange), url=broker.url,
                        transport=broker.transport, transport_options=broker.transport_options)
                    self._events = eo.EventOutbox(broadcast, maxsize, admit=self._check_open)
                outbox = self._events
        return outbox

    def _check_open(self) -> None:
        """Raise :class:`ClientClosed` once the client closed or retired (a view, a borrower
        or an event must then go to the broker's next client)."""
        if self._closed or self._retired:
            raise ClientClosed(f"The broker client for {self.broker} is closed")

    @property
    def views(self) -> int:
        """How many views are attached."""
        return len(self._views)

    def wait_drained(self, timeout: float | None = None) -> bool:
        """Block until the reply consumer has handled whatever reached the process's reply
        queue before this call (a whole consume cycle and the views' housekeeping); False on
        timeout."""
        return self.proxy.wait_drained(timeout)

    # -- views ------------------------------------------------------------------------------

    def attach(self, view: View, topics: list[str],
               connect_timeout: float = CONSUMER_START_TIMEOUT) -> list[TopicWorker]:
        """Attach ``view`` (starting the consumer if needed); return the workers known now.

        Args:
            view: The engine's executor.
            topics: The worker topics it asks for workers.
            connect_timeout: Seconds to wait for the consumer to be connected.

        Raises:
            BrokerUnreachable: No connection within ``connect_timeout`` seconds.
            ExecutionFailure: The consumer could not start (a refused login).
        """
        with self._lock:
            self._check_open()
            self._views[id(view)] = view
            self._idle_since = None
            new_topics = [t for t in topics if t not in self._asked]
            for topic in topics:
                self._topics[topic] = self._topics.get(topic, 0) + 1
            thread = self._start_consumer()
        try:
            self._wait_consuming(thread, connect_timeout)
        except Exception:
            # The view never starts, so nothing would detach it: the client must still linger
            # out and close (and stop retrying) once no other view uses it.
            self.detach(view, topics, [])
            raise
        known = self.known_workers()
        if new_topics or not known:
            self._round(force=bool(new_topics))
        return known

    def detach(self, view: View, topics: list[str], routed: list[str]) -> None:
        """Detach ``view`` and drop its ``routed`` request ids (a late reply is ignored, and a
        request still held until due is never published)."""
        with self._lock:
            self._views.pop(id(view), None)
            for request_id in routed:
                self._routes.pop(request_id, None)
                self.held.withdraw(request_id)
            for topic in topics:
                left = self._topics.get(topic, 1) - 1
                if left > 0:
                    self._topics[topic] = left
                else:
                    self._topics.pop(topic, None)
            if not self._views and not self._borrowers:
                self._idle_since = time.monotonic()
                if not self._timer_pending:
                    # A timer, not the consumer's housekeeping: a client whose broker is gone
                    # retries connecting and runs no housekeeping, yet must close when unused.
                    self._linger(LINGER)

    def route(self, request_id: str, view: View) -> None:
        """Replies with ``correlation_id == request_id`` go to ``view`` from now on."""
        self._routes[request_id] = view

    def unroute(self, request_id: str) -> None:
        """Replies for ``request_id`` are ignored from now on."""
        self._routes.pop(request_id, None)

    def take_suspends(self, flow_uuid: str, suspend: Callable[[str], None] | None) -> None:
        """SUSPEND messages for ``flow_uuid`` call ``suspend(action)`` from now on (None: no
        more); the action is ``"suspend"`` or ``"cancel"``."""
        with self._lock:
            if suspend is None:
                self._suspenders.pop(flow_uuid, None)
            else:
                self._suspenders[flow_uuid] = suspend

    def _on_suspend(self, data: Any, _message: Delivery) -> None:
        suspend = self._suspenders.get(data["flow_uuid"])
        if suspend is None:  # it ended (or was never here): the stored request is moot
            LOG.info("Ignoring a suspend request for flow %s: no engine of this process runs it",
                     data["flow_uuid"])
            return
        action = data.get("action") or rc.ACTION_SUSPEND
        LOG.info("Flow %s: %s asked through the broker", data["flow_uuid"], action)
        # Not on the consumer thread: suspending writes to the flow's store.
        self.submit(functools.partial(suspend, action))

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the client's dispatch thread (dropped once the client is closed)."""
        try:
            self._dispatcher.submit(fn)
        except RuntimeError:  # shut down
            LOG.debug("Broker client for %s is closed; dropped %r", self.broker, fn)

    def silenced(self, identity: str, by: View) -> None:
        """``by`` found worker ``identity`` silent (its lease on a running attempt lapsed, or
        it left a proof of life unanswered): the process's other engines send it nothing
        either, and engines attached later start with it silent, until it is heard from again
        (its next NOTIFY, asked every :data:`NOTIFY_PERIOD` seconds, or a reply to any engine's
        attempt: :meth:`heard_again`).

        A dead or frozen worker then costs the process one lost attempt, not one per engine
        that still took it for alive.
        """
        self._share_verdict(identity, by, silent=True)

    def heard_again(self, identity: str, by: View) -> None:
        """``by`` heard from worker ``identity`` (a reply to one of its attempts), which it
        took for silent: the process's other engines may send it work again too, rather than
        each waiting for its next NOTIFY."""
        self._share_verdict(identity, by, silent=False)

    def _share_verdict(self, identity: str, by: View, silent: bool) -> None:
        with self._lock:
            known = self._known.get(identity)
            if known is not None:  # what engines attached later start with
                known[1].silent = silent
            views = [view for view in self._views.values() if view is not by]
        for view in views:
            try:
                if silent:
                    view.worker_silenced(identity)
                else:
                    view.worker_heard(identity)
            except Exception:  # one engine's bug must not keep the verdict from the others
                LOG.exception("Telling %r that worker %s %s raised; the others are told", view,
                              identity, "fell silent" if silent else "was heard from again")

    def known_workers(self) -> list[TopicWorker]:
        """Workers heard from within the last :data:`RECENT` seconds (a silenced one as
        such: see :meth:`silenced`)."""
        cutoff = time.monotonic() - RECENT
        with self._lock:
            for identity in [i for i, (seen, _w) in self._known.items() if seen < cutoff]:
                del self._known[identity]
            return [worker for _seen, worker in self._known.values()]

    # -- consuming --------------------------------------------------------------------------

    def _start_consumer(self) -> threading.Thread:
        if self._thread is None or not self._thread.is_alive():
            self._consumer_error = None
            self._thread = threading.Thread(target=self._consume, daemon=True,
                                            name=f"flowengine-client-{self.uuid[:8]}")
            self._thread.start()
        return self._thread

    def _wait_consuming(self, thread: threading.Thread, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # Consuming, or the consumer gave up (a refused login): whichever comes first.
        while not self.proxy.wait(timeout=0.05):
            # A full or read-only flowengine-fs folder is named rather than "unreachable".
            problem = self._disk.problem if self._disk is not None else None
            if not thread.is_alive() or (problem and time.monotonic() > deadline):
                raise exc.ExecutionFailure(
                    f"Could not start consuming replies from "
                    f"{self.proxy.connection_details.uri}: "
                    f"{self._consumer_error or problem or 'timed out'}") from self._consumer_error
            if time.monotonic() > deadline:
                raise bo.BrokerUnreachable(self.proxy.connection_details.uri, timeout,
                                           self.proxy.connecting)

    def _consume(self) -> None:
        try:
            self.proxy.start()
        except Exception as err:  # kept for attach() to raise; retries are the proxy's own
            LOG.error("Broker client %s stopped consuming replies: %s", self.uuid, err)
            self._consumer_error = err

    def _on_response(self, data: Any, message: Delivery) -> None:
        view = self._routes.get(message.correlation_id)
        if view is None:
            # A reply to an attempt that already finished or lapsed (late, duplicate, or from
            # a worker that woke up): applying it would complete an atom twice. A late outcome
            # is worth a line; a RUNNING or progress reply may trail its outcome (flowengine
            # workers send them unconfirmed), which is routine.
            level = logging.INFO if data.get("state") in (pr.SUCCESS, pr.FAILURE) else logging.DEBUG
            LOG.log(level, "Ignoring %s reply for unknown or finished request %s",
                    data.get("state"), message.properties.get("correlation_id"))
            return
        view.on_reply(data, message)

    def _on_refused(self, message: Delivery, reason: str, detail: str) -> None:
        """An outcome nested too deeply to be read (a peer that does not bound what it sends,
        such as a TaskFlow worker) still ends its attempt, as a FAILURE that names the bound:
        its worker is alive and well, and waiting on the attempt would end only when its lease
        lapsed (shunning the worker and running the task again), or never."""
        state = message.body.get("state") if isinstance(message.body, dict) else None
        if (message.type != pr.RESPONSE or reason != dp.REASON_TOO_DEEP
                or state not in (pr.SUCCESS, pr.FAILURE)):
            return
        view = self._routes.get(message.correlation_id)
        if view is None:
            return
        worker = message.headers.get(pr.HEADER_WORKER)
        error = exc.InvalidFormat(
            f"The {state} reply to request {message.correlation_id} from "
            + (f"worker {str(worker)[:64]}" if worker else "a worker that does not name itself "
               "(a TaskFlow worker)")
            + f" was refused unread: its body {detail}, the bound "
            f"(protocol.MAX_NESTING_DEPTH) every flowengine peer applies")
        failure = pr.failure_to_dict(Failure.from_exception(error))
        view.on_reply({"state": pr.FAILURE, "data": {"result": failure}}, message)

    def _on_notify(self, data: Any, message: Delivery) -> None:
        headers = message.headers or {}
        identity = header(headers, pr.HEADER_WORKER) or data["topic"]
        with self._lock:
            if header(headers, pr.HEADER_WORKER_STATUS) == pr.WORKER_OFFLINE:
                self._known.pop(identity, None)
            else:
                self._known[identity] = (time.monotonic(), TopicWorker(
                    data["topic"], frozenset(data["tasks"]), identity,
                    capacity=header(headers, pr.HEADER_CAPACITY),
                    flowengine=header(headers, pr.HEADER_PROTOCOL) is not None,
                    protocol=protocol_version(header(headers, pr.HEADER_PROTOCOL))))
            views = list(self._views.values())
        for view in views:
            view.on_notify(data, message)

    def _on_connected(self) -> None:
        outage = self.proxy.last_outage
        if outage:
            # The process, not the workers, lost the broker: their leases must not lapse
            # for it, and the replies that waited meanwhile are drained before any is judged.
            LOG.warning("Broker client %s is back on %s after %.1fs without it", self.uuid,
                        self.broker, outage)
            with self._lock:
                views = list(self._views.values())
            for view in views:
                view.resumed(outage)
        self._round(force=True)

    def _housekeeping(self) -> None:
        # The consumer calls this after every drain (every few ms); scanning every view that
        # often costs more than it saves, and timeouts need no finer grain.
        now = time.monotonic()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + HOUSEKEEPING_PERIOD
        for publish in self.held.take_due():
            self.submit(publish)  # the dispatch thread may wait out an outage, this may not
        if self._disk is not None and self._disk_outage():
            return
        if now >= self._next_round and self._views:
            self._round(force=True)
        with self._lock:
            views = list(self._views.values())
        if now >= self._next_held_check:
            self._next_held_check = now + HELD_CHECK_PERIOD
            self._look_for_unheld(views)
        if len(views) > HOUSEKEEPING_BATCH:
            # Thousands of engines: each pass looks at a slice of them in turn, so the
            # consumer thread keeps its time for replies (timeouts need no finer grain).
            start = self._cursor % len(views)
            self._cursor = start + HOUSEKEEPING_BATCH
            views = (views + views)[start:start + HOUSEKEEPING_BATCH]
        for view in views:
            try:
                view.on_wait()
            except Exception:  # one engine's bug must not stop the others' replies
                LOG.exception("Housekeeping of %r raised; the others go on", view)

    def _look_for_unheld(self, views: list[View]) -> None:
        """Ask the broker, on the dispatch thread, whether it still holds the views' requests
        that were sent a while ago and that no worker said it runs (where it can lose one)."""
        if self._loses_takes is None:
            self._loses_takes = self.proxy.traits.driver == "redis"
        if not self._loses_takes or self._looking:
            return
        unjudged = self._unjudged
        if unjudged is not None and self.proxy.idle_drains <= unjudged[0]:
            # Replies are still backlogged: one that settles a request the look missed may
            # wait in the reply queue. Judged once the consumer has caught up.
            return
        suspects: list[tuple[str, str, View]] = []
        for view in views:
            try:
                suspects += [(rid, topic, view) for rid, topic in view.unheld_suspects()]
            except Exception:  # one engine's bug must not stop the others' looks
                LOG.exception("Listing the unanswered requests of %r raised", view)
        current = {rid: (topic, view) for rid, topic, view in suspects}
        if unjudged is not None:
            self._unjudged = None
            self._judge(unjudged[1], current)
        self._misses = {rid: n for rid, n in self._misses.items() if rid in current}
        if suspects:
            self._looking = True
            self.submit(functools.partial(self._look, suspects))

    def _judge(self, missing: set[str], current: dict[str, tuple[str, View]]) -> None:
        """Count a miss for each request the last look did not find that is still unanswered
        now that every reply sent before the look has been handled (a worker that finished it
        took it off the queue, but its reply had not been read yet); tell its view after
        :data:`HELD_MISSES` such looks in a row."""
        lost: list[tuple[str, str, View, int]] = []
        for rid in list(self._misses):
            if rid not in missing:
                del self._misses[rid]
        for rid in missing:
            if rid not in current:
                self._misses.pop(rid, None)  # answered meanwhile
                continue
            misses = self._misses.get(rid, 0) + 1
            if misses >= HELD_MISSES:
                self._misses.pop(rid, None)
                lost.append((rid, *current[rid], misses))
            else:
                self._misses[rid] = misses
        if lost:
            self.submit(functools.partial(self._tell_unheld, lost))

    @staticmethod
    def _tell_unheld(lost: list[tuple[str, str, View, int]]) -> None:
        for rid, topic, view, misses in lost:
            view.unheld(rid, f"the broker no longer holds its request (looked {misses} "
                             f"times, {HELD_CHECK_PERIOD:g}s apart): the worker that took it "
                             f"from topic {topic!r} may have died before recording it")

    def _look(self, suspects: list[tuple[str, str, View]]) -> None:
        """Ask the broker which of ``suspects`` it still holds (on the dispatch thread); the
        consumer thread judges the rest once the replies sent before the look are read."""
        try:
            by_topic: dict[str, list[str]] = {}
            for rid, topic, _view in suspects:
                by_topic.setdefault(topic, []).append(rid)
            missing: set[str] = set()
            for topic, rids in by_topic.items():
                try:
                    held = self.proxy.held(topic, rids)
                except Exception as err:  # the broker is away: nothing can be judged now
                    LOG.debug("Could not ask %s which requests it holds: %s", self.broker, err)
                    return
                if held is not None:
                    missing.update(rid for rid in rids if rid not in held)
            # Read after the look: a later idle drain means every reply sent before it (a
            # worker replies before it settles the request) has been handled.
            self._unjudged = (self.proxy.idle_drains, missing)
        finally:
            self.looks += 1
            self._looking = False

    def _disk_outage(self) -> bool:
        """Whether the flowengine-fs data folder is unwritable: nothing is judged meanwhile
        (the workers cannot send heartbeats either), and its end counts as a broker outage's."""
        assert self._disk is not None
        if self._disk.unwritable:
            return True
        outage = self._disk.take()
        if outage:
            with self._lock:
                views = list(self._views.values())
            for view in views:
                view.resumed(outage)
        return False

    def _lend(self) -> None:
        with self._lock:
            self._check_open()
            self._borrowers += 1
            self._idle_since = None

    def _give_back(self) -> None:
        with self._lock:
            self._borrowers -= 1
            if self._views or self._borrowers:
                return
            self._idle_since = time.monotonic()
            if not self._timer_pending:
                self._linger(LINGER)

    def _retire_if_idle(self) -> None:
        with self._lock:
            self._timer_pending = False
            if self._idle_since is None:
                return  # in use again
            left = LINGER - (time.monotonic() - self._idle_since)
            if left > 0:  # used and left again meanwhile: wait out the rest
                self._linger(left)
                return
        _retire(self)

    def _linger(self, seconds: float) -> None:
        """Look again in ``seconds`` whether the client is still unused (lock held)."""
        timer = threading.Timer(seconds, self._retire_if_idle)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError as err:  # no thread to spare: it stays open until exit
            LOG.debug("Broker client %s cannot schedule its idle close: %s", self.uuid, err)
            return
        self._timer_pending = True

    def ask_workers(self) -> None:
        """Ask every flowengine worker, and every topic in use, to answer now (a discovery
        round; none if one went out less than ``MIN_ROUND_GAP`` ago, whose answers serve)."""
        self._round()

    def _round(self, force: bool = False) -> None:
        """Ask every flowengine worker and every topic in use for its workers."""
        now = time.monotonic()
        with self._lock:
            if not force and now < self._next_round - NOTIFY_PERIOD + MIN_ROUND_GAP:
                return
            self._next_round = now + NOTIFY_PERIOD
            topics = list(self._topics)
            self._asked.update(topics)
        # The origin names this process in the log line of a worker that refuses the request.
        protocol = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION, pr.HEADER_ORIGIN: pr.origin()}
        try:
            # Every flowengine worker answers this one (TaskFlow workers ignore it).
            self.proxy.publish(pr.Notify(), ext.DISCOVER_ROUTING_KEY, reply_to=self.uuid,
                               headers=protocol, declare_queue=False, retry=False,
                               confirm=False)
        except Exception as err:
            LOG.debug("Could not broadcast a discovery request: %s", err)
        for topic in topics:
            try:
                # Not retried: this runs on the consumer thread, and a round follows soon.
                self.proxy.publish(pr.Notify(), topic, reply_to=self.uuid, headers=protocol,
                                   confirm=False, retry=False)
            except Exception as err:
                LOG.warning("Could not ask topic %r for workers: %s", topic, err)

    # -- closing ----------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Publish the events queued (within a few seconds), stop consuming, delete the reply
        queue and close the connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, self._thread = self._thread, None
        if self._events is not None:  # the events emitted until now go out first
            self._events.close(min(timeout, eo.EXIT_FLUSH_TIMEOUT))
        self.proxy.stop()
        self._dispatcher.shutdown(wait=False)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is not None:
            # Nothing reads the queue any more; left in place it would collect announcements.
            # (A client that never consumed, one only borrowed or publishing events, declared
            # none: it does not reach for a broker that may be away just to delete nothing.)
            self.proxy.delete_own_queue()
        self.proxy.close()


# -- the process's clients ------------------------------------------------------------------

_clients: dict[Broker, Client] = {}
_clients_lock = threading.Lock()


def client_for(broker: Broker) -> Client:
    """The process's client for ``broker``, created on first use."""
    with _clients_lock:
        client = _clients.get(broker)
        if client is None or client._closed or client._retired:
            client = _clients[broker] = Client(broker)
        return client


@contextlib.contextmanager
def borrowed(broker: Broker) -> Iterator[Client]:
    """The process's client for ``broker``, kept open while the block uses it.

    For what talks to a broker without running an engine (pausing a topic, telling an engine
    to suspend, dead letters, the dashboard): the block publishes, browses or takes through
    the client's publishers (``client.proxy``), on connections the process's engines share,
    and starts no consumer. Once neither a block nor an engine uses the client, it lingers
    :data:`LINGER` seconds for the next one, then closes.
    """
    while True:
        client = client_for(broker)
        try:
            client._lend()
        except ClientClosed:  # retired between the two steps: the next one is new
            continue
        break
    try:
        yield client
    finally:
        client._give_back()


def _retire(client: Client) -> None:
    """Close ``client`` if it is still idle (from its own consumer thread)."""
    with _clients_lock:
        with client._lock:
            if client._views or client._borrowers or client._closed:
                return
            client._retired = True
            if _clients.get(client.broker) is client:
                del _clients[client.broker]
    threading.Thread(target=client.close, daemon=True,
                     name=f"flowengine-client-close-{client.uuid[:8]}").start()


def clients() -> list[Client]:
    """The clients open in this process."""
    with _clients_lock:
        return list(_clients.values())


def close_all(timeout: float = 10.0) -> None:
    """Close every client of this process (at interpreter exit, or for tests)."""
    with _clients_lock:
        open_clients = list(_clients.values())
        _clients.clear()
    for client in open_clients:
        try:
            client.close(timeout)
        except Exception as err:  # exiting: nothing more to do about it
            LOG.debug("Closing broker client %s failed: %s", client.uuid, err)


def _forget_after_fork() -> None:
    # A child must not consume or publish over its parent's sockets: it builds its own clients.
    global _clients_lock
    _clients.clear()
    _clients_lock = threading.Lock()


atexit.register(close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
