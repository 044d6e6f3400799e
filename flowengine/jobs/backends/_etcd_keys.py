"""The etcd jobboard's keys, the v3 requests it sends through etcd3gw's gateway, its job type.

Every change is one etcd transaction (``/kv/txn``) whose comparisons make it atomic against
whatever else happened to the job: an ``If`` on the revisions last read, a ``Then`` that writes.
Keys and values travel base64-encoded; values are UTF-8 JSON (etcd3gw alone would encode text
as Latin-1).
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, Protocol, cast

from flowengine import states
from flowengine.jobs import base, records
from flowengine.jobs.backends._json_values import decode, encode

__all__ = ["KV", "EtcdJob", "Snapshot", "b64", "decode", "delete", "delete_prefix", "encode",
           "exists", "missing", "prefix_end", "put", "same", "trashed_job", "unb64"]

#: Keys flowengine adds next to TaskFlow's ``.data`` / ``.lock`` / ``.last_modified``.
ATTEMPTS_POSTFIX = ".attempts"
TOKEN_POSTFIX = ".fencing_token"
DATA_POSTFIX = ".data"
LOCK_POSTFIX = ".lock"
LAST_MODIFIED_POSTFIX = ".last_modified"
#: TaskFlow's ``last_modified`` format (oslo's "perfect" time format, UTC, naive).
LAST_MODIFIED_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"


def b64(data: str | bytes) -> str:
    """``data`` (text as UTF-8) in base64, as the gateway wants keys and values."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(data: str) -> bytes:
    """The bytes a base64 field holds."""
    return base64.b64decode(data)


def prefix_end(prefix: str) -> str:
    """The end of the key range of every key starting with ``prefix``."""
    raw = bytearray(prefix.encode("utf-8"))
    raw[-1] += 1
    return bytes(raw).decode("utf-8")


# ---- transaction pieces ------------------------------------------------------------------------

def put(key: str, value: bytes, lease: int | None = None) -> dict[str, Any]:
    """A ``Then`` that writes ``key`` (bound to ``lease`` if given)."""
    request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = lease
    return {"request_put": request}


def delete(key: str) -> dict[str, Any]:
    """A ``Then`` that deletes ``key``."""
    return {"request_delete_range": {"key": b64(key)}}


def delete_prefix(prefix: str) -> dict[str, Any]:
    """A ``Then`` that deletes every key starting with ``prefix``."""
    return {"request_delete_range": {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}}


def missing(key: str) -> dict[str, Any]:
    """An ``If``: ``key`` does not exist."""
    return {"key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}


def exists(key: str) -> dict[str, Any]:
    """An ``If``: ``key`` exists."""
    return {"key": b64(key), "result": "GREATER", "target": "CREATE", "create_revision": 0}


def same(key: str, kv: KV | None) -> dict[str, Any]:
    """An ``If``: ``key`` is as it was read (unchanged since, or still missing)."""
    if kv is None:
        return missing(key)
    return {"key": b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": kv.mod_revision}


# ---- reading -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KV:
    """A key as read: its value, last change and lease."""

    key: str
    value: bytes
    mod_revision: int
    lease: int

    @classmethod
    def from_gateway(cls, item: dict[str, Any]) -> KV:
        """The ``kvs`` item of a range answer (or the ``kv`` of a watch event)."""
        return cls(unb64(item["key"]).decode("utf-8"), unb64(item.get("value", "")),
                   int(item.get("mod_revision", 0)), int(item.get("lease", 0)))


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A job's keys as read together, at one revision.

    Attributes:
        key: The job's key (``<root>/job<N>``, TaskFlow's ``job.key``).
        data: Its ``.data`` (the posting).
        lock: Its ``.lock`` (the claim; bound to the claim's lease).
        attempts: Its ``.attempts`` counter.
        token: Its ``.fencing_token`` (its last claim's).
    """

    key: str
    data: KV | None
    lock: KV | None
    attempts: KV | None
    token: KV | None = None

    @classmethod
    def of(cls, key: str, kvs: list[KV]) -> Snapshot:
        """Sort the keys of a ``<key>.`` range read."""
        found = {kv.key[len(key):]: kv for kv in kvs}
        return cls(key, found.get(DATA_POSTFIX), found.get(LOCK_POSTFIX),
                   found.get(ATTEMPTS_POSTFIX), found.get(TOKEN_POSTFIX))

    @property
    def owner(self) -> str | None:
        """The claim's owner (None: unclaimed)."""
        return None if self.lock is None else str(decode(self.lock.value).get("owner") or "")

    @property
    def tries(self) -> int:
        """Claims so far."""
        return _number(self.attempts)

    @property
    def last_token(self) -> int:
        """The job's last claim's fencing token (0: none)."""
        return _number(self.token)


def _number(kv: KV | None) -> int:
    """The number a counter key holds (missing or damaged: 0)."""
    if kv is None:
        return 0
    try:
        return int(kv.value or b"0")
    except ValueError:
        return 0


def trashed_job(raw: bytes) -> base.TrashedJob | None:
    """The trashed job a trash key holds (None: not one)."""
    data = decode(raw)
    info = data.pop("trashed", None)
    data.pop("sequence", None)
    return records.trashed_job(data, info)


class _Reader(Protocol):
    def _read(self, job: base.Job) -> Snapshot: ...

    def _lease_ttl(self, lease: int) -> int: ...

    def _renew_lease(self, lease: int) -> int: ...


class EtcdJob(base.Job):
    """A job on an :class:`EtcdJobBoard` (state and attempts are read from etcd)."""

    def __init__(self, board: base.JobBoard, name: str, key: str, sequence: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(board, name, **kwargs)
        self._key = key
        self._sequence = sequence

    @property
    def key(self) -> str:
        """The job's key (its records are this plus ``.data``, ``.lock``...)."""
        return self._key

    @property
    def sequence(self) -> int:
        """The job's number (posting order)."""
        return self._sequence

    @property
    def state(self) -> str:
        """UNCLAIMED, CLAIMED or COMPLETE (gone)."""
        snap = self._etcd_board._read(self)
        if snap.data is None:
            return states.COMPLETE
        return states.CLAIMED if snap.lock is not None else states.UNCLAIMED

    @property
    def attempts(self) -> int:
        """Claims so far (0 once gone)."""
        return self._etcd_board._read(self).tries

    def expires_in(self) -> int:
        """Seconds until the claim expires unless renewed (-1: not claimed); TaskFlow's name."""
        snap = self._etcd_board._read(self)
        if snap.lock is None or not snap.lock.lease:
            return -1
        return self._etcd_board._lease_ttl(snap.lock.lease)

    def extend_expiry(self, expiry: float | None = None) -> bool:
        """Renew the claim's lease (TaskFlow's name; ``expiry`` is ignored, the lease keeps its
        length). Whether it was still alive."""
        snap = self._etcd_board._read(self)
        if snap.lock is None or not snap.lock.lease:
            return False
        return self._etcd_board._renew_lease(snap.lock.lease) > 0

    @property
    def _etcd_board(self) -> _Reader:
        return cast(_Reader, self._board)
