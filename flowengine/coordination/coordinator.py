"""A process's locks and limits on one coordination service: tickets, a waiting room, a keeper.

A :class:`Ticket` is one place in a key's queue (see :mod:`.service`). It is *held* once it is
among the first ``limit`` entries, and stays held until it is released or its lease is lost.
Every ticket of the process, held or waiting, is renewed by one
:class:`~flowengine.conductors.claims.ClaimKeeper` (the conductors' own keeper) every third of
the lease, and carries a :class:`~flowengine.conductors.claims.LeaseFence`: an engine running
under a ticket passes every write through :meth:`Ticket.check`, so a holder that was frozen,
cut off or killed past its lease writes nothing more, even before the keeper notices (the same
guarantee a conductor's claim gives, on the same lease clock, which counts host suspension).

Waiting is pushed: the service calls back when a key's queue changes, and the *waiting room*
(one thread) looks again at the tickets waiting on that key, in the order they joined, and
grants those that now hold it. On Redis, whose leases end silently, it also looks again when
the soonest lease ahead of a waiter may have ended.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime
import logging
import os
import socket
import threading
import uuid as uuidlib
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.conductors.claims import ClaimKeeper, LeaseFence
from flowengine.coordination.service import Entry, LeaseLost, Place, Service, check_key
from flowengine.jobs.lease_clock import lease_clock
from flowengine.worker_based.extensions import NO_EVENTS, EventSink

__all__ = ["Coordinator", "LockHeld", "Ticket"]

LOG = logging.getLogger(__name__)

Clock = Callable[[], float]


class LockHeld(exc.TaskFlowException):
    """A lock (or a limit) was asked for without waiting, and others hold it.

    Attributes:
        key: The lock or limit.
        holders: Who holds it (each a dict: owner, flow, job, task, since...).
    """

    def __init__(self, key: str, holders: tuple[Mapping[str, Any], ...] = (),
                 limit: int = 1) -> None:
        who = ", ".join(describe_holder(h) for h in holders) or "another holder"
        what = f"lock {key!r}" if limit == 1 else f"limit {key!r} ({limit} at once)"
        super().__init__(f"The {what} is held by {who}")
        self.key = key
        self.holders = holders


def describe_holder(info: Mapping[str, Any]) -> str:
    """One line naming who holds or waits (flow, job, task, owner), for messages and tables."""
    parts = []
    if info.get("job"):
        parts.append(f"job {info['job']}")
    flow = " ".join(str(info[k]) for k in ("flow_name", "flow") if info.get(k))
    if flow:
        parts.append(f"flow {flow}")
    if info.get("task"):
        parts.append(f"task {info['task']}")
    owner = info.get("owner")
    if not parts:
        return str(owner or "?")
    return " ".join(parts) + (f" of {owner}" if owner else "")


class Ticket:
    """One place in a key's queue: waiting, then held, until released or lost.

    Attributes:
        key: The lock or limit.
        limit: How many may hold it at once.
        kind: ``lock`` or ``limit`` (a concurrency limit, even of one), as shown.
        future: Done (with the ticket) once it is held; cancelled if released while waiting.
    """

    def __init__(self, coordinator: Coordinator, key: str, limit: int, entry: str,
                 info: Mapping[str, Any], fence: LeaseFence,
                 on_lost: Callable[[Ticket], None] | None) -> None:
        self.key = key
        self.limit = limit
        self.kind = str(info.get("kind") or ("lock" if limit == 1 else "limit"))
        self.entry = entry
        self.info = dict(info)
        self.fence = fence
        self.future: cf.Future[Ticket] = cf.Future()
        self.place: Place | None = None
        self.asked_at = coordinator.clock()
        self.held_at: float | None = None
        self._coordinator = coordinator
        self._on_lost = on_lost
        self._released = False
        self._granted = False
        self._announced_waiting = False  # a lock-waiting event was emitted for it
        self._lost_reported = False  # a lock-lost event was emitted for it

    @property
    def held(self) -> bool:
        """Whether it holds the key now (and its lease is certainly alive)."""
        return self.future.done() and not self.future.cancelled() and self.fence.held

    @property
    def released(self) -> bool:
        """Whether it was released (or given up after a loss)."""
        return self._released

    def waiting_for(self) -> dict[str, Any]:
        """What it waits for, as stored and shown: key, kind, limit, position, holders."""
        place = self.place
        return {"key": self.key, "kind": self.kind, "limit": self.limit,
                "position": place.position if place is not None else None,
                "holders": [describe_holder(h) for h in (place.holders if place else ())],
                "since": self.info.get("since")}

    def check(self, what: str) -> None:
        """Raise :class:`~flowengine.conductors.claims.FencedOff` unless the lease is held."""
        self.fence.check(what)

    def release(self) -> None:
        """Leave the queue (held or waiting); the next in line is woken. Idempotent."""
        self._coordinator._release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _lost(self) -> None:
        callback = self._on_lost
        if callback is not None:
            callback(self)

    def __repr__(self) -> str:
        state = "held" if self.held else "released" if self._released else "waiting"
        return f"<Ticket {self.kind} {self.key!r} {state}>"


class Coordinator:
    """Locks and limits for one process on one coordination service (see the module).

    Args:
        service: The service's queues (unconnected: :meth:`connect` connects it).
        owner: Who this process is, as holders are shown (default ``host:pid``).
        clock: The lease clock (injected in tests).
        events: Where ``lock-waiting``, ``lock-acquired``, ``lock-released`` and ``lock-lost``
            are reported (the event stream, metrics).
    """

    def __init__(self, service: Service, owner: str | None = None, clock: Clock = lease_clock,
                 events: EventSink = NO_EVENTS) -> None:
        self.service = service
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.clock = clock
        self.events = events
        self._keeper: ClaimKeeper | None = None
        self._lock = threading.Condition()
        self._waiting: dict[str, list[Ticket]] = {}
        self._tickets: set[Ticket] = set()  # every ticket not released, held or waiting
        self._dirty: set[str] = set()
        self._all_dirty = False
        self._timers: dict[str, float] = {}  # key -> when (clock) to look again
        self._closing = False
        self._room: threading.Thread | None = None

    @property
    def ttl(self) -> float:
        """Seconds a ticket's lease lasts without renewal."""
        return self.service.ttl

    def connect(self) -> Coordinator:
        """Connect the service, start the keeper and the waiting room; returns itself."""
        self.service.connect(self._changed)
        self._keeper = ClaimKeeper(None, f"coordination {self.owner}", clock=self.clock,
                                   interval=self.ttl / 3)
        self._keeper.start()
        self._room = threading.Thread(target=self._serve_waiters, daemon=True,
                                      name="coordination-waiters")
        self._room.start()
        return self

    def renew_now(self) -> None:
        """Renew every lease this process holds or waits with at once, without waiting for
        the keeper's next round (every third of the ttl): a process that knows it was paused,
        or that saw its service come back, calls it. A lease found lost is handled as on any
        round (the ticket is told, a held one refuses its holder's next write)."""
        if self._keeper is None:
            raise exc.JobFailure(f"Coordinator on {self.service.where} is not connected")
        self._keeper.renew_now()

    def close(self) -> None:
        """Release every ticket (held or waiting), stop the threads and disconnect."""
        with self._lock:
            self._closing = True
            tickets = list(self._tickets)
            self._lock.notify_all()
        for ticket in tickets:
            ticket.release()
        if self._keeper is not None:
            self._keeper.stop()
        if self._room is not None:
            self._room.join(5.0)
        self.service.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- asking ------------------------------------------------------------------------------

    def request(self, key: str, limit: int = 1, details: Mapping[str, Any] | None = None,
                on_lost: Callable[[Ticket], None] | None = None,
                kind: str | None = None) -> Ticket:
        """Join ``key``'s queue; the ticket's :attr:`~Ticket.future` is done once it holds it
        (at once if nobody is ahead).

        Args:
            key: The lock or limit.
            limit: How many may hold it at once (1: a lock).
            details: Who asks and for what (flow, job, task...), shown to others.
            on_lost: Called (on the keeper's thread) if the lease is lost while held.
            kind: ``lock`` or ``limit``, as shown (default: ``lock`` for a limit of one).

        Raises:
            ValueError: If ``key`` or ``limit`` is unusable (the message says why).
            flowengine.exceptions.JobFailure: If the service cannot be reached.
        """
        check_key(key)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"The limit of {key!r} must be a whole number >= 1, not {limit!r}")
        if self._keeper is None:
            raise exc.JobFailure(f"Coordinator on {self.service.where} is not connected")
        kind = kind or ("lock" if limit == 1 else "limit")
        info = {**(details or {}), "owner": self.owner, "kind": kind,
                "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        sent_at = self.clock()
        entry = self.service.join(key, limit, info)
        fence = LeaseFence(f"the holder of {kind} {key!r}", self.ttl, self.clock, sent_at)
        ticket = Ticket(self, key, limit, entry, info, fence, on_lost)
        self._keeper.hold_lease(self._lease_name(ticket), fence,
                                lambda: self.service.renew(key, ticket.entry),
                                lambda: self._lease_ended(ticket))
        with self._lock:
            # Listed before the first look, so that a change announced meanwhile is not missed.
            self._waiting.setdefault(key, []).append(ticket)
            self._tickets.add(ticket)
        self._look(ticket)
        return ticket

    def acquire(self, key: str, limit: int = 1, details: Mapping[str, Any] | None = None,
                wait: bool = True, timeout: float | None = None,
                on_lost: Callable[[Ticket], None] | None = None) -> Ticket:
        """Hold ``key`` (see :meth:`request`), blocking until it is held. Another thread ends
        the wait by releasing the ticket (:meth:`Ticket.release`).

        Args:
            key: The lock or limit.
            limit: How many may hold it at once.
            details: Who asks and for what.
            wait: False: raise :class:`LockHeld` at once if others hold it.
            timeout: Longest wait in seconds (None: until held).
            on_lost: As for :meth:`request`.

        Raises:
            LockHeld: If others hold it and ``wait`` is false, or ``timeout`` passed, or the
                ticket was released while it waited.
        """
        ticket = self.request(key, limit, details, on_lost)
        try:
            return ticket.future.result(timeout=timeout if wait else 0.0)
        except (cf.TimeoutError, cf.CancelledError):
            holders = ticket.place.holders if ticket.place is not None else ()
            ticket.release()
            raise LockHeld(key, holders, limit) from None

    def listing(self) -> list[Entry]:
        """Every lock and limit entry on the service (this process's and others'), by key."""
        return self.service.listing()

    # -- releasing and losing ----------------------------------------------------------------

    @staticmethod
    def _lease_name(ticket: Ticket) -> str:
        return f"{ticket.key}\0{ticket.entry}"

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket._released:
                return
            ticket._released = True
            self._tickets.discard(ticket)
            tickets = self._waiting.get(ticket.key, [])
            if ticket in tickets:
                tickets.remove(ticket)
        if self._keeper is not None:
            self._keeper.release_lease(self._lease_name(ticket))
        was_held = ticket.future.done() and not ticket.future.cancelled()
        ticket.future.cancel()
        try:
            self.service.leave(ticket.key, ticket.entry)
        except exc.TaskFlowException as err:
            # Its lease ends by itself (it is no longer renewed): the next in line waits that long.
            LOG.warning("Could not leave the queue of %r on %s (it ends with its lease): %s",
                        ticket.key, self.service.where, err)
        if was_held and ticket.held_at is not None and not ticket._lost_reported:
            self.events.emit("lock-released", key=ticket.key, kind=ticket.kind,
                             limit=ticket.limit, held_for=self.clock() - ticket.held_at,
                             **_fields(ticket.info))
        elif not was_held and ticket._announced_waiting and not ticket._granted:
            self.events.emit("lock-abandoned", key=ticket.key, kind=ticket.kind,
                             limit=ticket.limit, **_fields(ticket.info))

    def _lease_ended(self, ticket: Ticket) -> None:
        """The keeper found the ticket's lease gone (or lapsed): on the keeper's thread."""
        if ticket.future.done() and not ticket.future.cancelled():
            LOG.warning("%s lost the %s %r: %s", self.owner, ticket.kind, ticket.key,
                        ticket.fence.refusal("anything"))
            ticket._lost_reported = True
            self.events.emit("lock-lost", key=ticket.key, kind=ticket.kind, limit=ticket.limit,
                             **_fields(ticket.info))
            ticket._lost()
            return
        # Lost while waiting (frozen, cut off): join the queue again, at its tail.
        with self._lock:
            if ticket._released or self._closing:
                return
        LOG.warning("The place of %s in the queue of %r ended; joining it again", self.owner,
                    ticket.key)
        try:
            ticket.entry = self.service.join(ticket.key, ticket.limit, ticket.info)
        except exc.TaskFlowException as err:
            LOG.warning("Could not join the queue of %r again: %s", ticket.key, err)
            ticket.future.set_exception(err)
            return
        ticket.fence = LeaseFence(ticket.fence.subject, self.ttl, self.clock)
        assert self._keeper is not None
        self._keeper.hold_lease(self._lease_name(ticket), ticket.fence,
                                lambda: self.service.renew(ticket.key, ticket.entry),
                                lambda: self._lease_ended(ticket))
        self._changed(ticket.key)

    # -- the waiting room --------------------------------------------------------------------

    def _changed(self, key: str | None) -> None:
        """The service says ``key``'s queue changed (None: any may have). Never blocks long."""
        with self._lock:
            if key is None:
                self._all_dirty = True
            elif key in self._waiting:
                self._dirty.add(key)
            else:
                return
            self._lock.notify_all()

    def _serve_waiters(self) -> None:
        while True:
            with self._lock:
                while not self._closing and not self._due():
                    self._lock.wait(self._pause())
                if self._closing:
                    return
                keys = set(self._waiting) if self._all_dirty else set(self._dirty)
                now = self.clock()
                keys |= {k for k, when in self._timers.items() if when <= now}
                self._all_dirty = False
                self._dirty.clear()
                for key in keys:
                    self._timers.pop(key, None)
                batches = {key: list(self._waiting.get(key, ())) for key in keys}
            for key, tickets in batches.items():
                for ticket in tickets:
                    try:
                        self._look(ticket)
                    except Exception:  # the room must outlive any one failure
                        LOG.exception("Looking at the queue of %r failed", key)
                        with self._lock:
                            self._timers[key] = self.clock() + 1.0

    def _due(self) -> bool:
        if self._all_dirty or self._dirty:
            return True
        now = self.clock()
        return any(when <= now for when in self._timers.values())

    def _pause(self) -> float | None:
        if not self._timers:
            # A safety net, not a poll: changes are pushed; a missed one is found within this.
            return self.ttl if self._waiting else None
        return max(0.0, min(self._timers.values()) - self.clock())

    def _look(self, ticket: Ticket) -> None:
        """Look at ``ticket``'s place and grant it if it holds the key (the room's thread, or
        the asker's for the first look: both may look at once)."""
        if ticket._released or ticket.future.done():
            return
        try:
            place = self.service.look(ticket.key, ticket.entry, ticket.limit)
        except LeaseLost:
            return  # the keeper finds it lost and joins again
        except exc.TaskFlowException as err:
            LOG.warning("Could not look at the queue of %r: %s", ticket.key, err)
            with self._lock:
                self._timers[ticket.key] = self.clock() + 1.0
                self._lock.notify_all()
            return
        with self._lock:
            if ticket._released or ticket._granted:
                return
            first_look = ticket.place is None
            ticket.place = place
            if not place.holding and first_look:
                ticket._announced_waiting = True
            if not place.holding:
                if place.wake_in is not None:
                    when = self.clock() + place.wake_in + 0.01
                    self._timers[ticket.key] = min(self._timers.get(ticket.key, when), when)
                    self._lock.notify_all()
            else:
                ticket._granted = True
                tickets = self._waiting.get(ticket.key, [])
                if ticket in tickets:
                    tickets.remove(ticket)
                if not tickets:
                    self._waiting.pop(ticket.key, None)
                    self._timers.pop(ticket.key, None)
        if not place.holding:
            if first_look:
                self.events.emit("lock-waiting", key=ticket.key, kind=ticket.kind,
                                 limit=ticket.limit, position=place.position,
                                 holders=[describe_holder(h) for h in place.holders],
                                 **_fields(ticket.info))
            return
        ticket.held_at = self.clock()
        # Announced before its waiters hear (they may release it at once).
        self.events.emit("lock-acquired", key=ticket.key, kind=ticket.kind, limit=ticket.limit,
                         waited=ticket.held_at - ticket.asked_at,
                         had_waited=ticket._announced_waiting, **_fields(ticket.info))
        try:
            ticket.future.set_result(ticket)
        except cf.InvalidStateError:  # released (cancelled) meanwhile
            self.events.emit("lock-released", key=ticket.key, kind=ticket.kind,
                             limit=ticket.limit, held_for=0.0, **_fields(ticket.info))


def _fields(info: Mapping[str, Any]) -> dict[str, Any]:
    """The event fields naming who asked (flow, job, task)."""
    return {name: info[source] for name, source in (("flow_uuid", "flow"),
                                                    ("flow_name", "flow_name"), ("job", "job"),
                                                    ("task_name", "task"))
            if info.get(source)}


def new_owner_id() -> str:
    """A unique owner id for a process that does not name itself."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:6]}"
