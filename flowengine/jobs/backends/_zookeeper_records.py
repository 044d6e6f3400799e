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
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from flowengine.jobs import base

__all__ = ["ServerClock", "Snapshot", "decode", "encode", "posting_of"]

#: Keys flowengine adds to a job node's posting (TaskFlow readers ignore them).
ATTEMPTS, CLAIM, TRASHED = "attempts", "claim", "trashed"


def encode(data: dict[str, Any]) -> bytes:
    """JSON bytes for a node."""
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def decode(raw: bytes | None) -> dict[str, Any]:
    """A node's JSON data ({} if empty, not JSON or not an object)."""
    if not raw:
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def posting_of(data: dict[str, Any]) -> dict[str, Any]:
    """The posting alone (what :func:`~flowengine.jobs.base.format_posting` wrote)."""
    return {k: v for k, v in data.items() if k not in (ATTEMPTS, CLAIM, TRASHED)}


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
        return int((self.data or {}).get(ATTEMPTS) or 0)

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
        return float(self.stat.mtime) / 1000.0 + float(claim.get("ttl") or 0)

    def live_owner(self, now: float) -> str | None:
        """Who holds a claim that has not expired at server time ``now`` (None: nobody)."""
        end = self.lease_end()
        if end is not None and now >= end:
            return None
        return self.lock_owner


def session_hex(session_id: int) -> str:
    """A session id as a claim records it."""
    return f"{session_id:x}"


def trashed_job(data: dict[str, Any]) -> base.TrashedJob:
    """The :class:`~flowengine.jobs.base.TrashedJob` a trash node holds."""
    info = data.get(TRASHED) or {}
    return base.TrashedJob.from_dict({
        "uuid": data["uuid"], "name": data["name"], "posting": posting_of(data),
        "reason": info.get("reason", ""), "attempts": info.get("attempts", 0),
        "trashed_on": info.get("trashed_on") or base.utcnow().isoformat()})
