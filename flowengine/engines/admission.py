"""Admission: the locks a run holds, and the locks and limits each task waits for.

Three engine options and two task attributes decide what a run must hold (doc/coordination.rst):

* ``locks=["lb:1234"]``: the flow's own locks, held from before its first atom starts until its
  run ends (success, revert, failure, suspension), taken in sorted order so that two flows
  asking for the same locks cannot each hold one and wait for the other. ``on_conflict``
  (``wait``, the default, or ``reject``) says whether a run finding one held waits for it or
  fails at once with :class:`~flowengine.coordination.LockHeld`.
* ``concurrency={"RebootHost": 3}``: at most N of the tasks under a key running at once, across
  every engine using the same coordination service. A task counts under its class's name (short
  or fully qualified) and under each name in its ``concurrency_keys``.
* A task's ``locks`` (``("lb:{lb_id}",)``, formatted with its arguments): held while it
  executes or reverts.
* ``coordination``: the service (a jobboard URI or conf, or a
  :class:`~flowengine.coordination.Coordinator`); one per process is shared.

A task that must wait is left PENDING (or, for a revert, in its state), never RUNNING, with what
it waits for in its metadata (``waiting_for``), and is offered to the run loop again once it
holds everything. Every lease held passes every write of the run first
(:meth:`~flowengine.storage.Storage.guard_writes`): a run whose lock or limit lease was lost
halts, writing nothing more, as a conductor whose claim was lost does.

The engine layer never imports :mod:`flowengine.coordination` (a layer above it); it resolves
the service by name at run time and uses the small protocols below.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import importlib
import logging
import string
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from flowengine import exceptions as exc
from flowengine.atom import Atom
from flowengine.persistence.atom_meta import (
    META_COORDINATION,
    META_WAITING,
    PROGRESS_WAITING,
    describe_wait,
    waiting_of,
)
from flowengine.storage import Storage
from flowengine.task import Task

LOG = logging.getLogger(__name__)

# What a stored record says of locks and limits lives with the other record keys, so that the
# tools reading records (flowengine show, the dashboard) need not import the engine.
__all__ = ["ADMITTED", "META_COORDINATION", "META_WAITING", "PROGRESS_WAITING", "describe_wait",
           "waiting_of"]

#: Outcome of a task's admission: it holds what it waited for and may now start.
ADMITTED = "admitted"
ON_CONFLICT = ("wait", "reject")
#: The engine options admission reads (every engine understands them).
OPTIONS = frozenset({"locks", "on_conflict", "concurrency", "coordination", "lock_details"})


class Ticket(Protocol):
    """What the engine needs of a place in a lock's or limit's queue."""

    key: str
    limit: int
    future: cf.Future[Any]

    def check(self, what: str) -> None:
        """Raise a StorageFailure unless the lease is certainly held."""

    def release(self) -> None:
        """Leave the queue."""

    def waiting_for(self) -> dict[str, Any]:
        """What it waits for (key, kind, limit, position, holders)."""


class Coordination(Protocol):
    """What the engine needs of a coordination service."""

    def request(self, key: str, limit: int = 1, details: Mapping[str, Any] | None = None,
                on_lost: Callable[[Any], None] | None = None,
                kind: str | None = None) -> Ticket:
        """Join ``key``'s queue."""


def _names(option: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(
            isinstance(v, str) and v for v in value):
        raise ValueError(f"Engine option {option!r} must be a list of names, not {value!r}")
    return tuple(value)


def _limits(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if isinstance(value, str):  # an engine URI's "RebootHost=3,Other=2"
        pairs = [part.partition("=") for part in value.split(",") if part.strip()]
        value = {k.strip(): v.strip() for k, _, v in pairs}
    if not isinstance(value, Mapping):
        raise ValueError(f"Engine option 'concurrency' must map names to limits, like "
                         f"{{'RebootHost': 3}}, not {value!r}")
    return whole_limits("Engine option 'concurrency'", value)


def whole_limits(what: str, value: Mapping[Any, Any]) -> dict[str, int]:
    """``{name: N}`` with every N a whole number >= 1 (engines' and workers' limits).

    Raises:
        ValueError: ``what`` and the name whose limit is not one.
    """
    limits: dict[str, int] = {}
    for key, limit in value.items():
        try:
            number = int(limit)
        except (TypeError, ValueError):
            number = 0
        if not isinstance(key, str) or not key or isinstance(limit, bool) or number < 1:
            raise ValueError(f"{what}: {key!r} must map to a whole number >= 1, not {limit!r}")
        limits[key] = number
    return limits


def format_key(task: Atom, template: str, arguments: Mapping[str, Any]) -> str:
    """A task's lock or key ``template`` with its arguments in (``lb:{lb_id}``).

    Raises:
        ValueError: If the template names something that is not one of the task's arguments
            (only plain names: no attributes, no indexing).
    """
    fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    for field in fields:
        if not field.isidentifier():
            raise ValueError(f"Task {task.name!r}: lock or key {template!r} may only name "
                             f"arguments ({{name}}), not {{{field}}}")
        if field not in arguments:
            raise ValueError(f"Task {task.name!r}: lock or key {template!r} names {field!r}, "
                             f"which is not one of its arguments ({', '.join(sorted(arguments))})")
    return template.format_map({name: arguments[name] for name in fields})


def _class_names(task: Atom) -> tuple[str, str]:
    cls = type(task)
    return cls.__name__, f"{cls.__module__}.{cls.__qualname__}"


#: What option ``coordination`` names: a jobboard URI or conf, or a ready coordinator.
CoordinationConf = str | Mapping[str, Any] | Coordination


@dataclasses.dataclass(frozen=True)
class AdmissionOptions:
    """The engine options of locks and limits (see the module), validated.

    Attributes:
        locks: The flow's own locks, sorted, each once.
        on_conflict: ``"wait"`` or ``"reject"``.
        concurrency: ``{name: at most N running}``.
        coordination: The service holding them (None: none given).
        lock_details: Extra details each lock and lease records of its holder.
    """

    locks: tuple[str, ...] = ()
    on_conflict: str = "wait"
    concurrency: Mapping[str, int] = dataclasses.field(default_factory=dict)
    coordination: CoordinationConf | None = None
    lock_details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> AdmissionOptions:
        """Validate the options of :data:`OPTIONS` in ``options`` (others are not looked at).

        Raises:
            ValueError: A bad value; the message names the option.
        """
        on_conflict = str(options.get("on_conflict") or "wait").lower()
        if on_conflict not in ON_CONFLICT:
            raise ValueError(f"Engine option 'on_conflict' must be 'wait' or 'reject', not "
                             f"{options.get('on_conflict')!r}")
        details = options.get("lock_details") or {}
        if not isinstance(details, Mapping):
            raise ValueError(f"Engine option 'lock_details' must be a mapping, not "
                             f"{details!r}")
        return cls(locks=tuple(sorted(set(_names("locks", options.get("locks"))))),
                   on_conflict=on_conflict, concurrency=_limits(options.get("concurrency")),
                   coordination=options.get("coordination"), lock_details=dict(details))


class Admission:
    """The locks and limits of one engine (see the module).

    Args:
        options: The engine's validated locks and limits options.
    """

    def __init__(self, options: AdmissionOptions) -> None:
        self.locks = options.locks
        self.on_conflict = options.on_conflict
        self.concurrency = options.concurrency
        self.details = options.lock_details
        self._conf = options.coordination
        self._service: Coordination | None = None

    def needed_by(self, atoms: Iterable[Atom]) -> bool:
        """Whether a run of ``atoms`` holds or waits for anything."""
        if self.locks:
            return True
        for atom in atoms:
            if any(_templates(atom)):
                return True
            if self.concurrency and any(n in self.concurrency for n in _class_names(atom)):
                return True
        return False

    def check(self, atoms: Iterable[Atom]) -> None:
        """Refuse, before anything runs, locks or limits with no service to hold them on."""
        if self._conf is None and self.needed_by(atoms):
            raise ValueError("The flow holds locks or concurrency limits (engine options "
                             "'locks'/'concurrency', or a task's 'locks'), so the engine needs "
                             "a coordination service: pass coordination='redis://...' (the "
                             "jobboard's Redis, ZooKeeper or etcd)")

    @property
    def service(self) -> Coordination:
        """The process's coordinator for the ``coordination`` option (made on first use)."""
        if self._service is None:
            if self._conf is None:
                raise ValueError("No coordination service: pass coordination='redis://...'")
            # By name: the coordination layer sits above the engines (see the module).
            module = importlib.import_module("flowengine.coordination")
            self._service = module.shared(self._conf)
        return self._service

    def task_keys(self, task: Atom, arguments: Mapping[str, Any]) -> list[tuple[str, int, str]]:
        """The locks and limits ``task`` must hold to run with ``arguments``, sorted: each
        ``(key, limit, kind)``."""
        found: dict[str, tuple[int, str]] = {}
        locks, limits = _templates(task)
        for template in locks:
            found[format_key(task, template, arguments)] = (1, "lock")
        names = [*_class_names(task), *(format_key(task, t, arguments) for t in limits)]
        for name in names:
            if name in self.concurrency:
                found[name] = (self.concurrency[name], "limit")
        return sorted((key, limit, kind) for key, (limit, kind) in found.items())


def _templates(atom: Atom) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A task's lock and limit key templates (a retry controller holds none)."""
    if isinstance(atom, Task):
        return tuple(atom.locks or ()), tuple(atom.concurrency_keys or ())
    return (), ()


class FlowLocks:
    """The locks a run holds from its start to its end.

    Args:
        admission: The engine's admission.
        storage: The run's storage (its writes pass the locks' fences).
        on_lost: Called with why when a lock's lease is lost (the engine halts).
    """

    def __init__(self, admission: Admission, storage: Storage,
                 on_lost: Callable[[exc.StorageFailure], None]) -> None:
        self._admission = admission
        self._storage = storage
        self._on_lost = on_lost
        self._held: list[tuple[Ticket, Callable[[], None]]] = []
        self._waiting: Ticket | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    @property
    def keys(self) -> list[str]:
        """The locks held."""
        return [ticket.key for ticket, _ in self._held]

    def take(self) -> bool:
        """Hold every lock, in sorted order, waiting as ``on_conflict`` says; False if
        :meth:`stop` ended the wait (nothing is held then).

        Raises:
            LockHeld: If a lock is held by others and ``on_conflict`` is ``reject``.
        """
        admission, storage = self._admission, self._storage
        details = {**admission.details, "flow": storage.flow_uuid, "flow_name": storage.flow_name}
        try:
            for key in admission.locks:
                with self._lock:
                    if self._stopped.is_set():
                        break
                    ticket = self._waiting = admission.service.request(
                        key, 1, details, on_lost=self._lost)
                if not ticket.future.done():
                    if admission.on_conflict == "reject":
                        self._refuse(ticket)
                    self._record({"waiting": ticket.waiting_for()})
                    LOG.info("Flow %r (%s) waits for lock %r", storage.flow_name,
                             storage.flow_uuid, key)
                try:
                    ticket.future.result()
                except cf.CancelledError:
                    break
                with self._lock:
                    self._waiting = None
                    self._held.append((ticket, storage.guard_writes(ticket.check)))
        except BaseException:
            self.release()
            raise
        if self._stopped.is_set():
            self.release()
            return False
        if self._held:
            self._record({"locks": self.keys})
        return True

    def _refuse(self, ticket: Ticket) -> None:
        ticket.release()
        module = importlib.import_module("flowengine.coordination")
        place = getattr(ticket, "place", None)
        raise module.LockHeld(ticket.key, place.holders if place is not None else (),
                              ticket.limit) from None

    def _record(self, value: dict[str, Any]) -> None:
        self._storage.update_flow_metadata({META_COORDINATION: value})

    def _lost(self, ticket: Any) -> None:
        self._on_lost(ticket.fence.refusal("the progress") or exc.StorageFailure(
            f"The lock {ticket.key!r} was lost"))

    def stop(self) -> None:
        """End a wait for a lock (a suspension): :meth:`take` returns False."""
        with self._lock:
            self._stopped.set()
            waiting = self._waiting
        if waiting is not None:
            waiting.release()

    def release(self) -> None:
        """Release every lock held (and the one waited for)."""
        with self._lock:
            held, self._held = self._held, []
            waiting, self._waiting = self._waiting, None
        for ticket, unguard in reversed(held):
            unguard()
            ticket.release()
        if waiting is not None:
            waiting.release()


class _Wait:
    """One task's admission: its keys taken one after the other, in sorted order."""

    def __init__(self, keys: list[tuple[str, int, str]]) -> None:
        self.keys = keys
        self.tickets: list[Ticket] = []
        self.future: cf.Future[tuple[str, None]] = cf.Future()
        self.current: Ticket | None = None


class TaskGate:
    """The locks and limits of tasks, taken before each starts and released after its outcome
    is stored.

    Args:
        admission: The engine's admission.
        storage: The run's storage.
        held_by_flow: The flow's own locks (a task needs not take them again).
        on_lost: As for :class:`FlowLocks`.
    """

    def __init__(self, admission: Admission, storage: Storage, held_by_flow: Iterable[str],
                 on_lost: Callable[[exc.StorageFailure], None]) -> None:
        self._admission = admission
        self._storage = storage
        self._flow_keys = frozenset(held_by_flow)
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._held: dict[str, list[tuple[Ticket, Callable[[], None]]]] = {}
        self._waits: dict[str, _Wait] = {}

    def admit(self, task: Atom, arguments: Mapping[str, Any]) -> cf.Future[Any] | None:
        """None if ``task`` may start now (it holds what it needs, or needs nothing); else a
        future that ends with :data:`ADMITTED` once it holds everything (the task stays as it
        is meanwhile, with what it waits for in its metadata)."""
        with self._lock:
            if task.name in self._held:
                return None
            waiting = self._waits.get(task.name)
        if waiting is not None:
            return waiting.future
        keys = [found for found in self._admission.task_keys(task, arguments)
                if found[0] not in self._flow_keys]
        if not keys:
            return None
        wait = _Wait(keys)
        with self._lock:
            self._waits[task.name] = wait
        wait.future.add_done_callback(lambda f: self._ended(task, wait, f))
        self._next(task, wait)
        if wait.future.done() and not wait.future.cancelled():
            with self._lock:
                self._waits.pop(task.name, None)
            return None
        current = wait.current
        if current is not None:
            self._storage.update_atom_metadata(task.name, {META_WAITING: current.waiting_for()})
        return wait.future

    def _next(self, task: Atom, wait: _Wait) -> None:
        """Ask for the next key of ``wait`` (or end it: everything is held)."""
        if wait.future.done():
            return
        if len(wait.tickets) == len(wait.keys):
            try:
                wait.future.set_result((ADMITTED, None))
            except cf.InvalidStateError:
                pass  # cancelled meanwhile: _ended releases
            return
        key, limit, kind = wait.keys[len(wait.tickets)]
        details = {**self._admission.details, "flow": self._storage.flow_uuid,
                   "flow_name": self._storage.flow_name, "task": task.name}
        try:
            ticket = self._admission.service.request(key, limit, details, on_lost=self._lost,
                                                     kind=kind)
        except Exception as err:
            wait.future.set_exception(err)
            return
        wait.current = ticket
        ticket.future.add_done_callback(lambda f: self._granted(task, wait, ticket, f))

    def _granted(self, task: Atom, wait: _Wait, ticket: Ticket, future: cf.Future[Any]) -> None:
        if future.cancelled() or wait.future.done():
            ticket.release()
            return
        wait.tickets.append(ticket)
        self._next(task, wait)

    def _ended(self, task: Atom, wait: _Wait, future: cf.Future[Any]) -> None:
        with self._lock:
            if self._waits.get(task.name) is wait:
                del self._waits[task.name]
            admitted = not future.cancelled() and future.exception() is None
            if admitted:
                self._held[task.name] = [(t, self._storage.guard_writes(t.check))
                                         for t in wait.tickets]
        if not admitted:
            for ticket in [*wait.tickets, *([wait.current] if wait.current else [])]:
                ticket.release()

    def admitted(self, task: Atom) -> None:
        """The run loop heard that ``task`` was admitted: it no longer waits."""
        self._storage.update_atom_metadata(task.name, {META_WAITING: None})

    def started(self, task: Atom, future: cf.Future[Any]) -> None:
        """``task`` started as ``future``: what it holds goes if that is cancelled unstarted."""
        future.add_done_callback(lambda f: self.finished(task) if f.cancelled() else None)

    def finished(self, task: Atom) -> None:
        """``task``'s outcome is stored (or it never started): release what it holds."""
        with self._lock:
            held = self._held.pop(task.name, [])
        for ticket, unguard in held:
            unguard()
            ticket.release()

    def _lost(self, ticket: Any) -> None:
        self._on_lost(ticket.fence.refusal("the progress") or exc.StorageFailure(
            f"The {ticket.kind} {ticket.key!r} was lost"))

    def release_all(self) -> None:
        """The run ended: release everything held and stop every wait."""
        with self._lock:
            waits = list(self._waits.values())
            names = list(self._held)
        for wait in waits:
            wait.future.cancel()
        for name in names:
            with self._lock:
                held = self._held.pop(name, [])
            for ticket, unguard in held:
                unguard()
                ticket.release()
