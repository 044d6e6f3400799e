"""Suspend requests from other processes: a mark on the stored flow detail.

An engine runs its flow in one process; an operator's dashboard or ``flowengine suspend`` runs in
another. They share the persistence backend, so the request travels there: the requester sets
:data:`META_REQUEST` in the flow detail's meta (one write transaction, only while the flow is
RUNNING), and the engine running the flow reads it between its atom transitions, which already
write to storage, at most once every ``suspend_check_interval`` seconds (engine option, default
:data:`DEFAULT_INTERVAL`): no polling thread, and nothing read at all on the memory backend, which
no other process can reach. Seeing it, the engine calls its own ``suspend()``: running atoms
finish, nothing new starts. Its next flow state write (SUSPENDING) replaces the stored meta with
its own, which clears the mark.

While it runs, an engine with a shared backend records where it runs in :data:`META_RUNNING_ON`
(host, pid, engine, start time), so a requester can tell a flow whose process is gone from one
that will honour the request; the record is dropped when the run ends.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from flowengine.persistence.backends._uri import seconds_option

LOG = logging.getLogger(__name__)

#: Flow detail meta set by a requester: ``{"at": ISO time, "by": who asked}``.
META_REQUEST = "suspend_requested"
#: Flow detail meta set by the engine while it runs: ``{"host", "pid", "engine", "since"}``.
META_RUNNING_ON = "running_on"
#: Default seconds between two reads of the mark (the serial engine runs thousands of atom
#: transitions a second; reading the store at each would cost more than the atoms).
DEFAULT_INTERVAL = 0.25
#: Engine option naming the interval (seconds; 0 reads at every transition).
OPTION = "suspend_check_interval"


def shared(backend: Any) -> bool:
    """Whether another process can reach ``backend`` (not a per-process memory backend)."""
    from flowengine.persistence.backends import impl_memory

    return backend is not None and not isinstance(backend, impl_memory.MemoryBackend)


def interval_of(options: Mapping[str, Any]) -> float:
    """The ``suspend_check_interval`` engine option, validated (None: the default).

    Raises:
        ValueError: The option is not a number of seconds >= 0.
    """
    given = {OPTION: options.get(OPTION)} if options.get(OPTION) is not None else {}
    return seconds_option(given, OPTION, DEFAULT_INTERVAL, "Engine")


def running_on(engine: str) -> dict[str, Any]:
    """The :data:`META_RUNNING_ON` record of this process running a flow on ``engine``."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "engine": engine,
            "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


class SuspendWatch:
    """Reads a flow's suspend mark from its backend, at most once per ``interval``.

    Args:
        backend: The persistence backend the flow is stored in.
        flow_uuid: The flow detail's uuid.
        interval: Fewest seconds between two reads.
        clock: Monotonic seconds (injected by tests).
    """

    def __init__(self, backend: Any, flow_uuid: str, interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._backend = backend
        self._flow_uuid = flow_uuid
        self._interval = interval
        self._clock = clock
        self._next = clock() + interval
        self._seen = False

    def requested(self) -> bool:
        """True once the mark is seen (then never read again); a failed read is logged."""
        if self._seen:
            return False
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._interval
        try:
            conn = self._backend.get_connection()
            try:
                meta = conn.get_flow_details(self._flow_uuid, lazy=True).meta
            finally:
                conn.close()
        except Exception as err:  # the run must not fail for a request it may not even have
            LOG.warning("Could not read the suspend mark of flow %s: %s", self._flow_uuid, err)
            return False
        if META_REQUEST not in meta:
            return False
        self._seen = True
        LOG.info("Flow %s: suspend requested by %s at %s", self._flow_uuid,
                 meta[META_REQUEST].get("by"), meta[META_REQUEST].get("at"))
        return True


class SuspendRefused(Exception):
    """A suspend request that cannot reach an engine (the message says why)."""


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


def request_suspend(backend: Any, flow_uuid: str, by: str,
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
    from flowengine import exceptions as exc

    already: list[Any] = []
    refused: list[str] = []

    def mark(fd: Any) -> None:
        # A refusal is returned, not raised: the store wraps what a change raises.
        if fd.state != "RUNNING":
            refused.append(f"flow {fd.name!r} ({fd.uuid}) is {fd.state or 'PENDING'}, not "
                           "running anywhere: there is nothing to suspend")
        elif gone := _gone(fd.meta.get(META_RUNNING_ON)):
            refused.append(
                f"flow {fd.name!r} ({fd.uuid}) is stored as RUNNING, but {gone}: it is not "
                f"running anywhere; resume it instead (flowengine run --resume {fd.uuid})")
        elif META_REQUEST in fd.meta:
            already.append(fd.meta[META_REQUEST])
        else:
            fd.meta[META_REQUEST] = {"at": clock().isoformat(timespec="seconds"), "by": by}

    conn = backend.get_connection()
    try:
        change = getattr(conn, "change_flow_meta", None)
        if change is None:
            raise SuspendRefused(f"the {type(backend).__name__} cannot take suspend requests")
        fd = change(flow_uuid, mark)
    except exc.NotFound as err:
        raise SuspendRefused(f"no flow {flow_uuid!r} is stored in this backend") from err
    finally:
        conn.close()
    if refused:
        raise SuspendRefused(refused[0])
    where = fd.meta.get(META_RUNNING_ON)
    where = where if isinstance(where, dict) else None
    engine = (f" (its {where.get('engine')} runs in pid {where.get('pid')} on "
              f"{where.get('host')})" if where is not None else
              " (no engine recorded where it runs: if its process died, nothing will answer)")
    if already:
        return Requested(
            f"suspend of flow {fd.name!r} ({fd.uuid}) was already requested at "
            f"{already[0].get('at')}: it stops once its running atoms finish{engine}",
            where, False)
    return Requested(f"suspend requested for flow {fd.name!r} ({fd.uuid}): it stops once its "
                     f"running atoms finish{engine}", where, True)


def _gone(where: Any) -> str | None:
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
