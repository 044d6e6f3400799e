"""Suspend and cancel requests from other processes: a mark on the stored flow detail.

An engine runs its flow in one process; an operator's dashboard or ``flowengine suspend`` runs in
another. They share the persistence backend, so the request travels there: the requester sets
:data:`META_REQUEST` in the flow detail's meta (one write transaction, only while the flow is
RUNNING), and the engine running the flow reads it between its atom transitions, which already
write to storage, at most once every ``suspend_check_interval`` seconds (engine option, default
:data:`DEFAULT_INTERVAL`): no polling thread, and nothing read at all on the memory backend, which
no other process can reach. Seeing it, the engine calls its own ``suspend()``: running atoms
finish, nothing new starts. Its next flow state write (SUSPENDING) replaces the stored meta with
its own, which clears the mark.

A cancel request is the same mark under :data:`META_CANCEL_REQUEST` (with who asked, when and
why: :func:`request_cancel`); seeing it, the engine calls its own ``cancel()``. A cancel must
reach tasks that run for long (it asks them to stop), so it cannot wait for the next atom
transition: while a run's atoms run longer than a second, one process-wide thread
(:class:`RequestPoller`) reads the mark of its flow once every :data:`IDLE_INTERVAL` seconds (an
engine busy with transitions reads it itself, and is not read twice). A worker-based engine is
also told at once through the broker (:mod:`flowengine.worker_based.remote_control`).

While it runs, an engine with a shared backend records where it runs in :data:`META_RUNNING_ON`
(host, pid, engine, start time), so a requester can tell a flow whose process is gone from one
that will honour the request; the record is dropped when the run ends.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard

from flowengine import states
from flowengine.engines.stopping import CancelRequest
from flowengine.persistence.backends._uri import seconds_option
from flowengine.persistence.base import Backend

if TYPE_CHECKING:
    from flowengine.persistence.models import FlowDetail

LOG = logging.getLogger(__name__)

#: Flow detail meta set by a requester: ``{"at": ISO time, "by": who asked}``.
META_REQUEST = "suspend_requested"
#: Flow detail meta set by a canceller: ``{"at": ISO time, "by": who, "reason": why}``.
META_CANCEL_REQUEST = "cancel_requested"
#: Seconds between two reads of the marks of a flow whose atoms run long (see RequestPoller).
IDLE_INTERVAL = 1.0
#: Flow detail meta set by the engine while it runs: ``{"host", "pid", "engine", "since"}``.
META_RUNNING_ON = "running_on"
#: Default seconds between two reads of the mark (the serial engine runs thousands of atom
#: transitions a second; reading the store at each would cost more than the atoms).
DEFAULT_INTERVAL = 0.25
#: Engine option naming the interval (seconds; 0 reads at every transition).
OPTION = "suspend_check_interval"


def shared(backend: Backend | None) -> TypeGuard[Backend]:
    """Whether another process can reach ``backend`` (there is one, and it is not a
    per-process memory backend)."""
    from flowengine.persistence.backends import impl_memory

    return backend is not None and not isinstance(backend, impl_memory.MemoryBackend)


def interval_of(value: Any) -> float:
    """The ``suspend_check_interval`` engine option's ``value``, validated (None: the
    default).

    Raises:
        ValueError: The option is not a number of seconds >= 0.
    """
    given = {OPTION: value} if value is not None else {}
    return seconds_option(given, OPTION, DEFAULT_INTERVAL, "Engine")


def running_on(engine: str) -> dict[str, Any]:
    """The :data:`META_RUNNING_ON` record of this process running a flow on ``engine``."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "engine": engine,
            "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


class SuspendWatch:
    """Reads a flow's suspend and cancel marks from its backend, at most once per ``interval``.

    Args:
        backend: The persistence backend the flow is stored in.
        flow_uuid: The flow detail's uuid.
        interval: Fewest seconds between two reads.
        clock: Monotonic seconds (injected by tests).
    """

    def __init__(self, backend: Backend, flow_uuid: str, interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._backend = backend
        self._flow_uuid = flow_uuid
        self._interval = interval
        self._clock = clock
        self._next = clock() + interval
        self._read_at = clock()
        self._seen = False
        self._lock = threading.Lock()
        #: The cancel request read from the store, once one was.
        self.cancel: CancelRequest | None = None

    @property
    def read_at(self) -> float:
        """When (by its clock) the marks were last read (or the watch was made)."""
        return self._read_at

    def requested(self, force: bool = False) -> bool:
        """True once the suspend mark is seen (then never again); a failed read is logged.

        The same read sets :attr:`cancel` when the flow has a cancel request. ``force`` reads
        now, however recently the marks were read (the broker said there is news).
        """
        with self._lock:
            if self._seen and self.cancel is not None:
                return False  # nothing left to learn
            now = self._clock()
            if now < self._next and not force:
                return False
            self._next = now + self._interval
            self._read_at = now
            try:
                conn = self._backend.get_connection()
                try:
                    meta = conn.get_flow_details(self._flow_uuid, lazy=True).meta
                finally:
                    conn.close()
            except Exception as err:  # the run must not fail for a request it may not have
                LOG.warning("Could not read the suspend and cancel marks of flow %s: %s",
                            self._flow_uuid, err)
                return False
            if self.cancel is None:
                self.cancel = CancelRequest.from_record(meta.get(META_CANCEL_REQUEST))
                if self.cancel is not None:
                    LOG.info("Flow %s: cancel requested by %s at %s: %s", self._flow_uuid,
                             self.cancel.by, self.cancel.at, self.cancel.reason)
            if self._seen or META_REQUEST not in meta:
                return False
            self._seen = True
        LOG.info("Flow %s: suspend requested by %s at %s", self._flow_uuid,
                 meta[META_REQUEST].get("by"), meta[META_REQUEST].get("at"))
        return True


class RequestPoller:
    """Reads the marks of flows whose engines wait on long-running atoms, on one thread.

    An engine reads its marks between atom transitions; one whose atoms run for minutes makes
    none, yet a cancel must reach those atoms. While registered, a watch not read for
    ``idle`` seconds is read here, and ``on_read`` is called after each read (from this
    thread) to act on what was found. The thread runs while any watch is registered.

    Args:
        idle: Seconds without a read after which a watch is read here.
    """

    def __init__(self, idle: float = IDLE_INTERVAL) -> None:
        self._idle = idle
        self._lock = threading.Condition()
        self._watched: dict[int, tuple[SuspendWatch, Callable[[bool], None]]] = {}
        self._thread: threading.Thread | None = None

    def add(self, watch: SuspendWatch, on_read: Callable[[bool], None]) -> None:
        """Read ``watch`` when it goes unread; ``on_read(suspend_seen)`` after each read."""
        with self._lock:
            self._watched[id(watch)] = (watch, on_read)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="flowengine-request-poller")
                self._thread.start()

    def remove(self, watch: SuspendWatch) -> None:
        """Stop reading ``watch`` (its run ended)."""
        with self._lock:
            self._watched.pop(id(watch), None)
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._watched:
                    self._thread = None
                    return
                self._lock.wait(self._idle)
                due = [(w, on_read) for w, on_read in self._watched.values()
                       if time.monotonic() - w.read_at >= self._idle]
            for watch, on_read in due:
                try:
                    on_read(watch.requested(force=True))
                except Exception:  # one engine's trouble must not stop the others' reads
                    LOG.exception("Acting on the marks of a flow failed")


#: The process's poller (engines register their watch while they run).
POLLER = RequestPoller()


class SuspendRefused(Exception):
    """A suspend (or cancel) request that cannot reach an engine (the message says why)."""


class NotRunning(SuspendRefused):
    """The flow is not running anywhere (not stored RUNNING, or its process is gone).

    Attributes:
        state: The flow's stored state.
    """

    def __init__(self, message: str, state: str | None) -> None:
        super().__init__(message)
        self.state = state


class Requested(NamedTuple):
    """A stored suspend request.

    Attributes:
        text: What was done, for a page or a terminal.
        running_on: Where the flow's engine recorded it runs (None: it did not say).
        first: False when the request was already stored (this one changed nothing).
    """

    text: str
    running_on: dict[str, Any] | None
    first: bool


def request_suspend(backend: Backend, flow_uuid: str, by: str,
                    clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(
                        datetime.UTC)) -> Requested:
    """Ask the engine running a stored flow, in whichever process, to suspend it.

    Sets :data:`META_REQUEST` on the stored flow detail in one write transaction, only while it
    is RUNNING, and says what happens next.

    Args:
        backend: The persistence backend the flow is stored in (shared with its engine).
        flow_uuid: The flow detail's uuid.
        by: Who asks (shown in the engine's log), e.g. ``"dashboard"``.
        clock: The time now (aware, UTC).

    Returns:
        What was done, and where the engine runs.

    Raises:
        SuspendRefused: No such flow, it is not running, or its process is gone.
    """
    stamp = {"at": clock().isoformat(timespec="seconds"), "by": by}
    fd, where, first = _mark(backend, flow_uuid, "suspend", META_REQUEST, stamp,
                             (states.RUNNING,), "resume it instead (flowengine run --resume "
                             f"{flow_uuid})")
    if not first:
        return Requested(
            f"suspend of flow {fd.name!r} ({fd.uuid}) was already requested at "
            f"{fd.meta[META_REQUEST].get('at')}: it stops once its running atoms finish"
            f"{_engine(where)}", where, False)
    return Requested(f"suspend requested for flow {fd.name!r} ({fd.uuid}): it stops once its "
                     f"running atoms finish{_engine(where)}", where, True)


def request_cancel(backend: Backend, flow_uuid: str, reason: str, by: str,
                   clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(
                       datetime.UTC)) -> Requested:
    """Ask the engine running a stored flow, in whichever process, to cancel it.

    Sets :data:`META_CANCEL_REQUEST` on the stored flow detail in one write transaction, only
    while it runs (RUNNING or SUSPENDING) in a process that may still be alive.

    Args:
        backend: The persistence backend the flow is stored in (shared with its engine).
        flow_uuid: The flow detail's uuid.
        reason: Why (stored with the flow, shown wherever it is).
        by: Who asks.
        clock: The time now (aware, UTC).

    Raises:
        NotRunning: The flow is not running anywhere (cancel it by running its reverts).
        SuspendRefused: No such flow, or the backend takes no requests.
        ValueError: ``reason`` or ``by`` is empty.
    """
    request = CancelRequest.now(reason, by, clock)
    fd, where, first = _mark(backend, flow_uuid, "cancel", META_CANCEL_REQUEST,
                             request.record(), (states.RUNNING, states.SUSPENDING),
                             "cancel it here instead, by running its reverts")
    if not first:
        earlier = CancelRequest.from_record(fd.meta[META_CANCEL_REQUEST])
        return Requested(f"flow {fd.name!r} ({fd.uuid}) was already {earlier}: it is "
                         f"reverting what it did{_engine(where)}", where, False)
    return Requested(f"cancel requested for flow {fd.name!r} ({fd.uuid}): its running tasks "
                     f"are asked to stop, then what it did is reverted{_engine(where)}",
                     where, True)



def _mark(backend: Backend, flow_uuid: str, what: str, key: str, value: dict[str, Any],
          running: tuple[str, ...],
          instead: str) -> tuple[FlowDetail, dict[str, Any] | None, bool]:
    """Set ``key`` in a running flow's stored meta; return the flow detail, where it runs and
    whether this request was the first."""
    from flowengine import exceptions as exc

    already: list[Any] = []
    refused: list[NotRunning] = []

    def mark(fd: FlowDetail) -> None:
        # A refusal is returned, not raised: the store wraps what a change raises.
        if fd.state not in running:
            refused.append(NotRunning(
                f"flow {fd.name!r} ({fd.uuid}) is {fd.state or 'PENDING'}, not running "
                f"anywhere: there is nothing to {what}", fd.state))
        elif dead := gone(fd.meta.get(META_RUNNING_ON)):
            refused.append(NotRunning(
                f"flow {fd.name!r} ({fd.uuid}) is stored as {fd.state}, but {dead}: it is not "
                f"running anywhere; {instead}", fd.state))
        elif key in fd.meta:
            already.append(fd.meta[key])
        else:
            fd.meta[key] = value

    conn = backend.get_connection()
    try:
        change = getattr(conn, "change_flow_meta", None)
        if change is None:
            raise SuspendRefused(f"the {type(backend).__name__} cannot take {what} requests")
        fd = change(flow_uuid, mark)
    except exc.NotFound as err:
        raise SuspendRefused(f"no flow {flow_uuid!r} is stored in this backend") from err
    finally:
        conn.close()
    if refused:
        raise refused[0]
    where = fd.meta.get(META_RUNNING_ON)
    return fd, where if isinstance(where, dict) else None, not already


def _engine(where: dict[str, Any] | None) -> str:
    if where is None:
        return " (no engine recorded where it runs: if its process died, nothing will answer)"
    return f" (its {where.get('engine')} runs in pid {where.get('pid')} on {where.get('host')})"


def gone(where: object) -> str | None:
    """Why the process recorded in ``where`` surely runs nothing (None: it may run it)."""
    if not isinstance(where, dict) or where.get("host") != socket.gethostname():
        return None  # another host's processes cannot be seen from here
    pid = where.get("pid")
    if not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its engine process (pid {pid} on {where['host']}) is gone"
    except PermissionError:
        return None  # alive, another user's
    return None
