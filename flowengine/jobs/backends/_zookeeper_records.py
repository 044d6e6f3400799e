"""What the ZooKeeper jobboard stores in its nodes, and ZooKeeper's clock as seen from here.

A claim is a lease in two parts: the ephemeral ``<job>.lock`` node (TaskFlow's, ``{"owner"}``),
which the service deletes when its holder's session ends, and a ``claim`` entry in the job's
own node (``{"owner", "ttl", "session"}``), whose lease ends ``ttl`` seconds after the job
node's ``mtime``. Renewing a claim rewrites the job node, which moves its ``mtime``: ``mtime``
is the server's clock, so every board reads the same end for the same lease, whatever its own
clock says. A lock without a matching ``claim`` entry (a TaskFlow conductor's) lasts as long as
its session, as in TaskFlow.
"""

from __future__ import annotations

import dataclasses
import datetime
import posixpath
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from flowengine.jobs import base, records
from flowengine.jobs.backends._json_values import decode, encode

from kazoo import exceptions as k_exc  # isort: skip  (the board imports kazoo_utils first)

__all__ = ["ATTEMPTS", "CLAIM", "FENCING_TOKEN", "LOCK_POSTFIX", "TRASHED", "LeaseTimers",
           "ServerClock",
           "Snapshot", "ZookeeperJob", "decode", "encode", "from_millis", "posting_of",
           "read_node", "read_raw", "session_hex", "trashed_job"]

#: A claim's node is its job's node plus this (TaskFlow's name).
LOCK_POSTFIX = ".lock"
#: Keys flowengine adds to a job node's posting (TaskFlow readers ignore them).
ATTEMPTS, CLAIM, TRASHED = "attempts", "claim", "trashed"
#: The job's last claim's fencing token (kept, never lowered, while the job is on the board).
FENCING_TOKEN = "fencing_token"


def posting_of(data: dict[str, Any]) -> dict[str, Any]:
    """The posting alone (what :func:`~flowengine.jobs.base.format_posting` wrote)."""
    return {k: v for k, v in data.items() if k not in (ATTEMPTS, CLAIM, TRASHED, FENCING_TOKEN)}


class ServerClock:
    """ZooKeeper's wall clock, estimated from the local one and the ``mtime`` of our writes.

    A write's ``mtime`` is the server's time between sending it and hearing back, so the
    offset is known to within half a round trip. Only the board's own reads (state, owner,
    when to wake) use the estimate; taking over an expired claim asks the server itself.

    Args:
        wall: The local wall clock (injected in tests).
    """

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._offset = 0.0
        self._lock = threading.Lock()

    @property
    def wall(self) -> Callable[[], float]:
        """The local wall clock."""
        return self._wall

    def observe(self, mtime_ms: int, sent_at: float, received_at: float) -> None:
        """A write sent at ``sent_at`` and answered at ``received_at`` got ``mtime_ms``."""
        with self._lock:
            self._offset = mtime_ms / 1000.0 - (sent_at + received_at) / 2.0

    def now(self) -> float:
        """The server's time now (seconds since the epoch), estimated."""
        return self._wall() + self._offset


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A job node and its lock node as read together (``None``: the node does not exist).

    Attributes:
        path: The job node's path.
        data: The job node's data (posting plus ``attempts`` and ``claim``).
        stat: The job node's stat.
        lock: The lock node's data.
        lock_stat: The lock node's stat.
    """

    path: str
    data: dict[str, Any] | None
    stat: Any
    lock: dict[str, Any] | None
    lock_stat: Any

    @property
    def attempts(self) -> int:
        """Claims so far (0 if the job is gone)."""
        try:
            return int((self.data or {}).get(ATTEMPTS) or 0)
        except (TypeError, ValueError):  # a damaged counter counts as none
            return 0

    @property
    def fencing_token(self) -> int:
        """The job's last claim's fencing token (0: never claimed, or a damaged one)."""
        try:
            return int((self.data or {}).get(FENCING_TOKEN) or 0)
        except (TypeError, ValueError):
            return 0

    @property
    def lock_owner(self) -> str | None:
        """The lock's owner, expired or not."""
        return None if self.lock is None else str(self.lock.get("owner") or "") or None

    def lease_end(self) -> float | None:
        """When the claim's lease ends (server seconds); None if it only ends with its session."""
        if self.lock is None or self.data is None:
            return None
        claim = self.data.get(CLAIM)
        if not isinstance(claim, dict) or claim.get("owner") != self.lock_owner:
            return None
        if claim.get("session") != session_hex(self.lock_stat.ephemeralOwner):
            return None
        try:
            return float(self.stat.mtime) / 1000.0 + float(claim.get("ttl") or 0)
        except (TypeError, ValueError):  # a damaged claim entry: the lock alone decides
            return None

    def live_owner(self, now: float) -> str | None:
        """Who holds a claim that has not expired at server time ``now`` (None: nobody)."""
        end = self.lease_end()
        if end is not None and now >= end:
            return None
        return self.lock_owner


def session_hex(session_id: int) -> str:
    """A session id as a claim records it."""
    return f"{session_id:x}"


def trashed_job(data: dict[str, Any]) -> base.TrashedJob | None:
    """The :class:`~flowengine.jobs.base.TrashedJob` a trash node holds (None: not one)."""
    return records.trashed_job(posting_of(data), data.get(TRASHED))


def read_raw(request: Any) -> tuple[bytes | None, Any]:
    """The (raw data, stat) a kazoo ``get_async`` gave; (None, None) if the node does not
    exist."""
    try:
        raw, stat = request.get()
    except k_exc.NoNodeError:
        return None, None
    return bytes(raw or b""), stat


def read_node(request: Any) -> tuple[dict[str, Any] | None, Any]:
    """The (data, stat) a kazoo ``get_async`` gave; (None, None) if the node does not exist."""
    raw, stat = read_raw(request)
    return (None, None) if raw is None else (decode(raw), stat)


def from_millis(millis: int) -> datetime.datetime:
    """A node's ``ctime``/``mtime`` as an aware UTC datetime."""
    return datetime.datetime.fromtimestamp(millis / 1000.0, datetime.UTC)


class _Reader(Protocol):
    def _state(self, job: ZookeeperJob) -> str: ...

    def _attempts(self, job: ZookeeperJob) -> int: ...

    def _stat(self, job: ZookeeperJob) -> Any: ...


class ZookeeperJob(base.Job):
    """A job on a :class:`ZookeeperJobBoard` (state and attempts are read from ZooKeeper)."""

    def __init__(self, board: base.JobBoard, name: str, path: str, **kwargs: Any) -> None:
        super().__init__(board, name, **kwargs)
        self._path = path
        digits = posixpath.basename(path).rpartition("job")[2]
        self._sequence = int(digits) if digits.isdigit() else 0

    @property
    def path(self) -> str:
        """The job node's path."""
        return self._path

    @property
    def lock_path(self) -> str:
        """The claim (lock) node's path."""
        return self._path + LOCK_POSTFIX

    @property
    def sequence(self) -> int:
        """The job node's sequence number (posting order)."""
        return self._sequence

    def stamp(self, stat: Any) -> None:
        """Take the dates the posting lacks from the node's ``stat`` (TaskFlow's are there)."""
        if self._created_on is None:
            self._created_on = from_millis(stat.ctime)
        if self._last_modified is None:
            self._last_modified = from_millis(stat.mtime)

    @property
    def created_on(self) -> datetime.datetime | None:
        """When it was posted: its node's ``ctime`` (None once it is gone)."""
        if self._created_on is None:
            self._read_dates()
        return self._created_on

    @property
    def last_modified(self) -> datetime.datetime | None:
        """When its node last changed (posted, claimed, renewed, released), as last read."""
        if self._last_modified is None:
            self._read_dates()
        return self._last_modified

    def _read_dates(self) -> None:
        stat = cast(_Reader, self._board)._stat(self)
        if stat is not None:
            self.stamp(stat)

    @property
    def state(self) -> str:
        """UNCLAIMED, CLAIMED or COMPLETE (gone)."""
        return cast(_Reader, self._board)._state(self)

    @property
    def attempts(self) -> int:
        """Claims so far (0 once gone)."""
        return cast(_Reader, self._board)._attempts(self)


class LeaseTimers:
    """When the claims a board has seen end, so that its waiters wake then (no polling).

    ZooKeeper announces a lock node that goes, not a lease that runs out; these timers cover
    the second. Each end is announced once: a lease found over is forgotten.

    Args:
        clock: ZooKeeper's clock.
    """

    def __init__(self, clock: ServerClock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ends: dict[str, float] = {}

    def note(self, snap: Snapshot) -> None:
        """Remember when the claim ``snap`` shows ends (or that it has none)."""
        end = snap.lease_end()
        with self._lock:
            if end is not None and end > self._clock.now():
                self._ends[snap.path] = end
            else:
                self._ends.pop(snap.path, None)

    def forget(self, path: str) -> None:
        """The job at ``path`` is gone."""
        with self._lock:
            self._ends.pop(path, None)

    def clear(self) -> None:
        """Forget every lease."""
        with self._lock:
            self._ends.clear()

    def next_wakeup(self) -> float | None:
        """Seconds until the soonest lease ends (0: one just did); None if none is known."""
        now = self._clock.now()
        with self._lock:
            for path in [p for p, end in self._ends.items() if end <= now]:
                del self._ends[path]
                return 0.0
            soonest = min(self._ends.values(), default=None)
        # A hair past the end, so that the look finds it over.
        return None if soonest is None else soonest - now + 0.005
