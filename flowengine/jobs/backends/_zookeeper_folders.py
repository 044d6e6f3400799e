"""The ZooKeeper jobboard's two side folders: the trash and the registered entities.

Both work on a started kazoo client and let kazoo's errors through; the board turns them into
jobboard errors that name the board and the action.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import threading
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine.jobs import base
from flowengine.types.entity import Entity
from flowengine.utils import kazoo_utils

from kazoo import exceptions as k_exc  # isort: skip  (kazoo_utils names the extra if missing)
from kazoo.client import KazooClient

from flowengine.jobs.backends import _zookeeper_records as rec

__all__ = ["EntityFolder", "FolderMethods", "TrashFolder"]

LOG = logging.getLogger(__name__)

Node = tuple[str, dict[str, Any], Any]


def _children(client: KazooClient, folder: str) -> list[Node]:
    """(path, data, stat) of each child of ``folder`` that holds a JSON object, read at once."""
    try:
        names = client.get_children(folder)
    except k_exc.NoNodeError:
        return []
    requests = [(posixpath.join(folder, n), client.get_async(posixpath.join(folder, n)))
                for n in names]
    found = [(path, *rec.read_node(request)) for path, request in requests]
    return [(path, data, stat) for path, data, stat in found if data]


class TrashFolder:
    """Trashed jobs: one node each, named as the job node was, holding its posting and why.

    Args:
        client: The board's client.
        path: The trash folder.
        board: The board's name (for errors).
    """

    def __init__(self, client: KazooClient, path: str, board: str) -> None:
        self._client, self.path, self._board = client, path, board

    def move_in(self, txn: Any, snap: rec.Snapshot, reason: str,
                attempts: int | None = None) -> None:
        """Add to ``txn`` what moves the job ``snap`` shows into the trash (``attempts``:
        what the trash records, by default the job's)."""
        assert snap.data is not None
        data = dict(rec.posting_of(snap.data), trashed={
            "reason": reason, "attempts": snap.attempts if attempts is None else attempts,
            "trashed_on": base.utcnow().isoformat()})
        txn.create(posixpath.join(self.path, posixpath.basename(snap.path)), rec.encode(data))

    def jobs(self) -> list[base.TrashedJob]:
        """The trashed jobs, oldest first."""
        found = [rec.trashed_job(data) for _, data, _ in _children(self._client, self.path)]
        return sorted((t for t in found if t is not None), key=lambda t: t.trashed_on)

    def find(self, job_uuid: str) -> Node:
        """The trash node of job ``job_uuid``.

        Raises:
            flowengine.exceptions.NotFound: If no trashed job has that uuid.
        """
        for path, data, stat in _children(self._client, self.path):
            if data.get("uuid") == job_uuid:
                return path, data, stat
        raise exc.NotFound(f"No trashed job {job_uuid} on board '{self._board}'")

    def repost(self, job_uuid: str, job_base: str) -> tuple[str, dict[str, Any]]:
        """Move job ``job_uuid`` back to a new sequential node at ``job_base``; its path and
        posting."""
        path, data, stat = self.find(job_uuid)
        posting = dict(rec.posting_of(data), last_modified=base.utcnow().isoformat())
        txn = self._client.transaction()
        txn.create(job_base, rec.encode(posting), sequence=True)
        txn.delete(path, version=stat.version)
        try:
            new_path = kazoo_utils.checked_commit(txn)[0]
        except kazoo_utils.KazooTransactionException as err:
            raise exc.NotFound(f"No trashed job {job_uuid} on board '{self._board}' (reposted"
                               f" or discarded meanwhile)") from err
        return str(new_path), posting

    def discard(self, job_uuid: str) -> None:
        """Delete job ``job_uuid`` from the trash."""
        path, _, stat = self.find(job_uuid)
        try:
            self._client.delete(path, version=stat.version)
        except (k_exc.NoNodeError, k_exc.BadVersionError) as err:
            raise exc.NotFound(f"No trashed job {job_uuid} on board '{self._board}' (reposted"
                               f" or discarded meanwhile)") from err


class EntityFolder:
    """Registered entities: ``<path>/<kind>/<name>``, ephemeral, each a lease of ``ttl`` s.

    Registering again rewrites the node (its ``mtime`` restarts the lease). The folder
    remembers what it registered, so that a new session (the old one's nodes are gone) can
    register it all again (:meth:`register_again`).

    Args:
        client: The board's client.
        path: The entity folder.
        board: The board's name (for logs).
        now: ZooKeeper's clock (server seconds).
    """

    def __init__(self, client: KazooClient, path: str, board: str,
                 now: Callable[[], float]) -> None:
        self._client, self.path, self._board, self._now = client, path, board, now
        self._lock = threading.Lock()
        self._registered: dict[str, Entity] = {}

    def _node(self, entity: Entity) -> str:
        return posixpath.join(self.path, entity.kind, entity.name)

    def register(self, entity: Entity, ttl: float) -> None:
        """Create or refresh ``entity``'s node for ``ttl`` seconds."""
        client, path = self._client, self._node(entity)
        raw = rec.encode({**entity.to_dict(), "ttl": ttl})
        stat = client.exists(path)
        if stat is not None and stat.ephemeralOwner == client.client_id[0]:
            client.set(path, raw)
        else:
            client.ensure_path(posixpath.dirname(path))
            txn = client.transaction()
            if stat is not None:
                LOG.warning("Jobboard %s: %s '%s' was registered by another session; the newest"
                            " registration replaces it", self._board, entity.kind, entity.name)
                txn.delete(path, version=stat.version)
            txn.create(path, raw, ephemeral=True)
            kazoo_utils.checked_commit(txn)
        with self._lock:
            self._registered[path] = entity

    def unregister(self, entity: Entity) -> None:
        """Delete ``entity``'s node if this session made it."""
        client, path = self._client, self._node(entity)
        with self._lock:
            self._registered.pop(path, None)
        stat = client.exists(path)
        if stat is not None and stat.ephemeralOwner == client.client_id[0]:
            with contextlib.suppress(k_exc.NoNodeError):
                client.delete(path)

    def register_again(self, ttl: float) -> None:
        """Register everything registered before (after a new session)."""
        with self._lock:
            entities = list(self._registered.values())
        for entity in entities:
            try:
                self.register(entity, ttl)
            except k_exc.KazooException as err:
                LOG.warning("Jobboard %s could not register %s again: %s", self._board, entity,
                            err)

    def live(self, kind: str | None = None) -> list[Entity]:
        """The entities (of ``kind``) whose lease has not ended, sorted by kind and name."""
        kinds = [kind] if kind else self._client.get_children(self.path)
        nodes = [node for each in kinds
                 for node in _children(self._client, posixpath.join(self.path, each))]
        now = self._now()
        found = [Entity.from_dict(data) for _, data, stat in nodes
                 if "kind" in data and "name" in data
                 and (data.get("ttl") is None or stat.mtime / 1000.0 + float(data["ttl"]) > now)]
        return sorted(found, key=lambda e: (e.kind, e.name))

    def forget(self) -> None:
        """Forget what was registered (the board is closing)."""
        with self._lock:
            self._registered.clear()


class FolderMethods:
    """The board's trash and entity methods, over its :class:`TrashFolder` and
    :class:`EntityFolder` (a mixin of :class:`~.impl_zookeeper.ZookeeperJobBoard`)."""

    JOB_PREFIX: str
    options: base.BoardOptions
    _path: str
    _trash: TrashFolder
    _entities: EntityFolder
    _require: Callable[[], KazooClient]
    _failures: Callable[[str], contextlib.AbstractContextManager[None]]
    _job: Callable[[str, bytes | dict[str, Any], Any], base.Job | None]

    def iter_trash(self) -> list[base.TrashedJob]:
        """The trashed jobs, oldest first."""
        with self._failures("list its trash"):
            return self._trash.jobs()

    def repost(self, job_uuid: str) -> base.Job:
        """Put a trashed job back on the board, unclaimed, with no attempts counted."""
        self._require()
        with self._failures(f"repost trashed job {job_uuid}"):
            path, posting = self._trash.repost(job_uuid,
                                               posixpath.join(self._path, self.JOB_PREFIX))
        job = self._job(path, posting, None)
        if job is None:
            raise exc.JobFailure(f"Re-posted trashed job {job_uuid} on the board at"
                                 f" {self._path}, but it is a damaged posting: discard it")
        return job

    def discard(self, job_uuid: str) -> None:
        """Delete a trashed job for good."""
        self._require()
        with self._failures(f"discard trashed job {job_uuid}"):
            self._trash.discard(job_uuid)

    def register_entity(self, entity: Entity) -> None:
        """Record ``entity`` (an ephemeral node) for ``claim_ttl`` seconds; again: refresh it."""
        self._require()
        with self._failures(f"register {entity.kind} '{entity.name}'"):
            self._entities.register(entity, self.options.claim_ttl)

    def unregister_entity(self, entity: Entity) -> None:
        """Forget ``entity`` now."""
        self._require()
        with self._failures(f"unregister {entity.kind} '{entity.name}'"):
            self._entities.unregister(entity)

    def iter_entities(self, kind: str | None = None) -> list[Entity]:
        """The registered entities whose registration has not expired, sorted by kind, name."""
        self._require()
        with self._failures("list entities"):
            return self._entities.live(kind)
