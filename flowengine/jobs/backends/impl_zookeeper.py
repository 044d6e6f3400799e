"""The ZooKeeper jobboard: TaskFlow's node layout, claims that are leases, watches that wake.

Layout, TaskFlow's, for a board ``path`` (conf key; ``/taskflow/jobs`` by default):

===================================  ===========================================================
``<path>/job0000000007``             a job: its posting (JSON), plus ``attempts``, ``claim``
                                     and ``fencing_token`` (its last claim's)
``<path>/job0000000007.lock``        its claim: ephemeral, ``{"owner"}``
``<parent>/.trash/job0000000007``    a trashed job: its posting plus ``trashed`` (why, when)
``<parent>/.entities/<kind>/<name>`` a registered entity (a conductor), ephemeral
===================================  ===========================================================

A claim lasts ``claim_ttl`` seconds from its last renewal (:meth:`ZookeeperJobBoard.keep_alive`
rewrites the job node; see :mod:`._zookeeper_records` for how the end is read) and never longer
than its holder's session: a killed, frozen or cut-off holder loses its lock node when the
session expires. The session timeout (conf ``timeout``) is therefore at least ``claim_ttl``; a
shorter one shortens ``claim_ttl`` to match, so a conductor's fence never outlives its claim.
Entities are registered the same way. Waiting is pushed: a children watch on ``<path>`` fires on
every post, claim, release and removal; a claim that ends by time wakes waiters through a timer
set from its own lease, never by polling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import posixpath
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import base, records
from flowengine.utils import kazoo_utils

from kazoo import exceptions as k_exc  # isort: skip  (kazoo_utils names the extra if missing)
from kazoo.client import KazooClient, KazooState

from flowengine.jobs.backends import _zookeeper_records as rec
from flowengine.jobs.backends._json_values import new_posting
from flowengine.jobs.backends._zookeeper_folders import EntityFolder, FolderMethods, TrashFolder
from flowengine.jobs.backends._zookeeper_records import ZookeeperJob
from flowengine.jobs.backends._zookeeper_watch import JobWatch, listing_version
from flowengine.persistence.base import Backend

if TYPE_CHECKING:
    from flowengine.persistence import models

__all__ = ["ZookeeperJob", "ZookeeperJobBoard"]

LOG = logging.getLogger(__name__)

_STARTING = threading.Lock()


class ZookeeperJobBoard(FolderMethods, base.NotifyingJobBoard):
    """A jobboard on ZooKeeper through kazoo (conf: TaskFlow's ``hosts``, ``path``, ``timeout``
    and the other keys of :func:`~flowengine.utils.kazoo_utils.make_client`; plus ``claim_ttl``
    and ``max_attempts``).

    Args:
        name: The board's name.
        conf: The conf (see above).
        client: A kazoo client to use instead of one built from ``conf`` (started if it is not;
            never stopped by :meth:`close`).
        persistence: The persistence backend jobs' logbooks are loaded from.
        wall_clock: The local wall clock, from which ZooKeeper's is estimated (tests inject it).
    """

    DEFAULT_PATH = "/taskflow/jobs"
    JOB_PREFIX = "job"
    LOCK_POSTFIX = rec.LOCK_POSTFIX
    TRASH_FOLDER = ".trash"
    ENTITY_FOLDER = ".entities"
    #: Multi-operation transactions need ZooKeeper 3.4.
    MIN_ZK_VERSION = (3, 4, 0)
    #: kazoo's own default session timeout, used when ``claim_ttl`` is shorter.
    MIN_SESSION_TIMEOUT = 10.0

    def __init__(self, name: str, conf: dict[str, Any], client: KazooClient | None = None,
                 persistence: Backend | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        super().__init__(name, conf, persistence)
        path = str(self._conf.get("path") or self.DEFAULT_PATH)
        if not path.startswith("/") or posixpath.normpath(path) == "/":
            raise ValueError(f"ZooKeeper jobboard path must be absolute and below the root"
                             f" (like /taskflow/jobs), not {path!r}")
        self._path = posixpath.normpath(path)
        parent = posixpath.dirname(self._path)
        self._trash_path = posixpath.join(parent, self.TRASH_FOLDER)
        self._entity_path = posixpath.join(parent, self.ENTITY_FOLDER)
        ttl = self.options.claim_ttl
        if client is None:
            conf_for_client = dict(self._conf)
            conf_for_client.setdefault("timeout", max(ttl, self.MIN_SESSION_TIMEOUT))
            client = kazoo_utils.make_client(conf_for_client)
            self._owns_client = True
        else:
            self._owns_client = False
        session = getattr(client, "_session_timeout", None)
        if session and session / 1000.0 < ttl:
            # The lock node would vanish with the session before the lease ends.
            LOG.warning("Jobboard %s: ZooKeeper session timeout %.1fs is shorter than claim_ttl"
                        " %.1fs; claims last %.1fs", name, session / 1000.0, ttl,
                        session / 1000.0)
            self.options = dataclasses.replace(self.options, claim_ttl=session / 1000.0)
        self._client = client
        self._clock = rec.ServerClock(wall_clock)
        self._leases = rec.LeaseTimers(self._clock)
        self._trash = TrashFolder(client, self._trash_path, name)
        self._entities = EntityFolder(client, self._entity_path, name, self._clock.now)
        self._watch: JobWatch[ZookeeperJob] = JobWatch(
            client, self._path, self._is_job, self._job, self.notifier, self._notify_change,
            lambda: self._entities.register_again(self.options.claim_ttl), name)
        self._connected = False

    # ---- TaskFlow's properties -----------------------------------------------------------------

    @property
    def path(self) -> str:
        """Where job nodes live."""
        return self._path

    def _location(self) -> str:
        return self._path

    @property
    def trash_path(self) -> str:
        """Where trashed jobs live."""
        return self._trash_path

    @property
    def entity_path(self) -> str:
        """Where registered entities live."""
        return self._entity_path

    @property
    def connected(self) -> bool:
        """Whether :meth:`connect` ran, :meth:`close` did not, and the session is up."""
        return self._connected and bool(self._client.connected)

    # ---- connection ----------------------------------------------------------------------------

    def connect(self, timeout: float = 10.0) -> None:
        """Start the session, create the board's folders and start watching its jobs.

        Raises:
            flowengine.exceptions.JobFailure: If ZooKeeper cannot be reached in ``timeout`` s.
            flowengine.exceptions.IncompatibleVersion: If the server is older than 3.4.
        """
        if self._connected:
            return
        try:
            with _STARTING:
                # Boards sharing a client (TaskFlow's examples do) must not start it twice at
                # once: kazoo's start closes whatever connection is being made.
                if self._client.state == KazooState.LOST:
                    self._client.start(timeout=timeout)
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            hosts = ",".join(f"{host}:{port}" for host, port in self._client.hosts)
            raise exc.JobFailure(f"Jobboard '{self.name}' cannot connect to ZooKeeper at"
                                 f" {hosts}: {err}") from err
        try:
            with self._failures("set up its folders"):
                if str(self._conf.get("check_compatible", "1")).lower() not in ("0", "false",
                                                                                 "no"):
                    kazoo_utils.check_compatible(self._client, self.MIN_ZK_VERSION)
                for folder in (self._path, self._trash_path, self._entity_path):
                    self._client.ensure_path(folder)
                self._server_now()
        except exc.TaskFlowException:
            if self._owns_client:
                kazoo_utils.finalize_client(self._client)
            raise
        self._connected = True
        self._watch.start()

    def close(self) -> None:
        """Stop watching, forget the cache and, if the board made its client, end the session
        (its claims and registrations then go at once)."""
        if not self._connected:
            return
        self._connected = False
        self._watch.stop()
        if self._owns_client:
            kazoo_utils.finalize_client(self._client)
        self._leases.clear()
        self._entities.forget()
        self._notify_change()

    @contextlib.contextmanager
    def _failures(self, action: str, job: base.Job | None = None) -> Iterator[None]:
        what = f" job {job.uuid} ({job.name})" if job is not None else ""
        try:
            yield
        except k_exc.NoNodeError as err:
            raise exc.NotFound(f"Jobboard '{self.name}' could not {action}{what}: it is not on"
                               f" the board") from err
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            raise exc.JobFailure(f"Jobboard '{self.name}' could not {action}{what}:"
                                 f" {type(err).__name__} {err}".rstrip()) from err

    def _require(self) -> KazooClient:
        if not self._connected:
            raise exc.JobFailure(f"Jobboard '{self.name}' is not connected")
        return self._client

    def _session(self) -> str:
        return rec.session_hex(self._client.client_id[0] if self._client.client_id else 0)

    def _server_now(self) -> float:
        """The server's time now, exactly: the ``mtime`` of a write to the board's own node."""
        sent = self._clock.wall()
        stat = self._client.set(self._path, b"")
        self._clock.observe(stat.mtime, sent, self._clock.wall())
        return float(stat.mtime) / 1000.0

    # ---- following changes ---------------------------------------------------------------------

    def _is_job(self, child: str) -> bool:
        return child.startswith(self.JOB_PREFIX) and not child.endswith(self.LOCK_POSTFIX)

    def _job(self, path: str, data: bytes | dict[str, Any], stat: Any) -> ZookeeperJob | None:
        """The job a node holds (its raw data, or a posting); None if it is damaged, which is
        reported and, when its ``stat`` is known, moved to the trash."""
        try:
            posting = (records.read_posting(data) if isinstance(data, bytes)
                       else records.check_posting(data))
            job = ZookeeperJob.from_posting(self, rec.posting_of(posting),
                                            backend=self._persistence, path=path)
        except (KeyError, TypeError, ValueError) as err:
            if self._damage.found(path, str(err)) and isinstance(data, bytes) and stat:
                self._trash_damaged(path, data, stat, str(err))
            return None
        self._damage.cleared(path)
        if job._created_on is None and stat is not None:
            job._created_on = rec.from_millis(stat.ctime)
        return job

    def _trash_damaged(self, path: str, raw: bytes, stat: Any, reason: str) -> None:
        """Move the damaged node ``path`` to the trash, unless it changed since ``stat`` or
        somebody holds its lock: the transaction creates and deletes the lock node itself,
        which fails if one exists."""
        client = self._require()
        why = f"damaged posting: {reason}"
        record = dict(records.damaged_posting(path, raw, why), **{rec.TRASHED: {
            "reason": why, "attempts": 0, "trashed_on": base.utcnow().isoformat()}})
        txn = client.transaction()
        txn.create(path + self.LOCK_POSTFIX, b"", ephemeral=True)
        txn.delete(path + self.LOCK_POSTFIX)
        txn.create(posixpath.join(self._trash_path, posixpath.basename(path)),
                   rec.encode(record))
        txn.delete(path, version=stat.version)
        try:
            kazoo_utils.checked_commit(txn)
        except (kazoo_utils.KazooTransactionException, k_exc.KazooException,
                client.handler.timeout_exception) as err:
            LOG.debug("Jobboard %s left the damaged posting %s on the board: %s", self.name,
                      path, err)
            return
        self._damage.trashed(path)

    def _stat(self, job: ZookeeperJob) -> Any:
        """The job node's stat (None if it is gone)."""
        with self._failures("read the dates of", job):
            return self._require().exists(job.path)

    def _next_wakeup(self) -> float | None:
        return self._leases.next_wakeup()

    # ---- reading -------------------------------------------------------------------------------

    def _read(self, path: str) -> rec.Snapshot:
        return self._read_many([path])[0]

    def _read_many(self, paths: list[str]) -> list[rec.Snapshot]:
        """Each job's node and lock node, all asked for at once (one round trip)."""
        client = self._require()
        with self._failures("read job nodes under " + self._path):
            requests = [(p, client.get_async(p), client.get_async(p + self.LOCK_POSTFIX))
                        for p in paths]
            snaps = []
            for path, job_request, lock_request in requests:
                data, stat = rec.read_node(job_request)
                lock, lock_stat = rec.read_node(lock_request)
                snaps.append(rec.Snapshot(path, data, stat, lock if data is not None else None,
                                          lock_stat))
        for snap in snaps:
            self._leases.note(snap)
        return snaps

    def _attempts(self, job: ZookeeperJob) -> int:
        return self._read(job.path).attempts

    def _state(self, job: ZookeeperJob) -> str:
        snap = self._read(job.path)
        if snap.data is None:
            return states.COMPLETE
        return states.CLAIMED if snap.live_owner(self._clock.now()) else states.UNCLAIMED

    def _path_of(self, job: base.Job) -> str:
        if not isinstance(job, ZookeeperJob):
            raise exc.NotFound(f"Job {job.uuid} ({job.name}) is not a job of ZooKeeper board"
                               f" '{self.name}'")
        return job.path

    def iterjobs(self, only_unclaimed: bool = False,
                 ensure_fresh: bool = False) -> Iterator[base.Job]:
        """Jobs on the board, most urgent then oldest first (see :meth:`JobBoard.iterjobs`)."""
        self._require()
        # Looked up at each read, under TaskFlow's name for this step: TaskFlow's own conductor
        # tests make the service fail there, while the conductor iterates.
        return base.JobBoardIterator(self, lambda fresh: self._fetch_jobs(fresh),
                                     only_unclaimed, ensure_fresh)

    def _fetch_jobs(self, ensure_fresh: bool = False) -> list[tuple[base.Job, str]]:
        """Every job with its state, most urgent then oldest first (``ensure_fresh``: list the
        service's nodes rather than the watch's cache)."""
        client = self._require()
        # The listing shows which jobs have a lock; only those need reading (at once).
        with self._failures("list its jobs"):
            listing, stat = client.get_children(self._path, include_data=True)
        children = set(listing)
        jobs = (self._watch.sync(listing, listing_version(stat)) if ensure_fresh
                else self._watch.jobs())
        jobs.sort(key=lambda j: (j.priority.rank, j.sequence))
        locked = {snap.path: snap for snap in self._read_many(
            [j.path for j in jobs if posixpath.basename(j.lock_path) in children])}
        now = self._clock.now()
        listed: list[tuple[base.Job, str]] = []
        for job in jobs:
            snap = locked.get(job.path)
            if posixpath.basename(job.path) not in children or (snap and snap.data is None):
                listed.append((job, states.COMPLETE))
            elif snap is not None and snap.live_owner(now):
                listed.append((job, states.CLAIMED))
            else:
                listed.append((job, states.UNCLAIMED))
        return listed

    @property
    def job_count(self) -> int:
        """How many jobs the board's cache holds (kept current by the watch)."""
        return len(self._watch.jobs())

    def find_owner(self, job: base.Job) -> str | None:
        """Who holds a live claim on ``job``; raises NotFound if it is gone."""
        snap = self._read(self._path_of(job))
        if snap.data is None:
            raise exc.NotFound(f"Job {job.uuid} ({job.name}) is not on board '{self.name}'")
        return snap.live_owner(self._clock.now())

    # ---- changing ------------------------------------------------------------------------------

    def post(self, name: str, book: models.LogBook | None = None,
             details: dict[str, Any] | None = None,
             priority: base.JobPriority | str = base.JobPriority.NORMAL) -> base.Job:
        """Post a job (details must be JSON-ready); every board watching is woken.

        The node holds TaskFlow's posting alone: its dates are the node's own (``ctime``,
        ``mtime``), as TaskFlow reads them.
        """
        posting, raw = new_posting(name, book, details, priority, dated=False)
        with self._failures(f"post job '{name}'"):
            path = self._require().create(posixpath.join(self._path, self.JOB_PREFIX), raw,
                                          sequence=True)
        job = self._job(path, posting, None)
        assert job is not None
        job._book = book
        self._watch.add(path, job)
        self._notify_change()
        return job

    def _commit(self, txn: Any, action: str, job: base.Job) -> list[Any]:
        """Commit ``txn``; a refused one raises the error of its first failed operation."""
        try:
            return kazoo_utils.checked_commit(txn)
        except kazoo_utils.KazooTransactionException as err:
            causes = [e for _, e in err.failures if not isinstance(e, k_exc.RolledBackError)]
            cause = causes[0] if causes else err
            if isinstance(cause, k_exc.NoNodeError):
                raise exc.NotFound(f"Cannot {action} job {job.uuid} ({job.name}): it is not on"
                                   f" board '{self.name}'") from err
            raise exc.UnclaimableJob(f"Cannot {action} job {job.uuid} ({job.name}): it changed"
                                     f" meanwhile ({type(cause).__name__})") from err

    @base.check_who
    def claim(self, job: base.Job, who: str, expiry: float | None = None) -> int:
        """Claim ``job`` for ``expiry`` or ``claim_ttl`` seconds (see :meth:`JobBoard.claim`);
        :meth:`keep_alive` renews it for as long again.

        The fencing token returned is kept in the job's node, written by the claim's own
        (versioned) write: above the job's last one, and at least ZooKeeper's clock (as
        estimated here) in microseconds (:func:`~flowengine.jobs.records.fencing_token`).
        """
        ttl = self._lease_seconds(expiry)
        client = self._require()
        snap = self._read(self._path_of(job))
        if snap.data is None:
            raise exc.NotFound(f"Cannot claim job {job.uuid} ({job.name}): it is not on board"
                               f" '{self.name}'")
        owner = snap.live_owner(self._clock.now())
        if owner is None and snap.lock is not None:
            # Expired by our estimate of the server's clock; the server's own word decides.
            with self._failures("read ZooKeeper's clock for", job):
                owner = snap.live_owner(self._server_now())
        if owner is not None:
            raise exc.UnclaimableJob(f"Job {job.uuid} ({job.name}) is already claimed by"
                                     f" '{owner}'")
        limit = self.options.max_attempts
        if limit and snap.attempts >= limit:
            self._to_trash(snap, job, f"abandoned or orphaned {snap.attempts} times")
            raise exc.UnclaimableJob(f"Job {job.uuid} ({job.name}) was moved to the trash: it was"
                                     f" abandoned or orphaned {snap.attempts} times")
        assert snap.data is not None
        token = records.fencing_token(snap.fencing_token, self._clock.now())
        data = dict(snap.data, attempts=snap.attempts + 1, claim={
            "owner": who, "ttl": ttl, "session": self._session()})
        data[rec.FENCING_TOKEN] = token
        txn = client.transaction()
        txn.set_data(snap.path, rec.encode(data), version=snap.stat.version)
        if snap.lock is not None:
            txn.delete(snap.path + self.LOCK_POSTFIX, version=snap.lock_stat.version)
        txn.create(snap.path + self.LOCK_POSTFIX, rec.encode({"owner": who}), ephemeral=True)
        sent = self._clock.wall()
        with self._failures("claim", job):
            stat = self._commit(txn, "claim", job)[0]
        self._clock.observe(stat.mtime, sent, self._clock.wall())
        self._read(snap.path)  # notes the new lease, for waiters' timers
        return token

    def _owned(self, job: base.Job, who: str, action: str) -> rec.Snapshot:
        """The job's nodes, once sure ``who`` holds a live claim on it."""
        snap = self._read(self._path_of(job))
        if snap.data is None:
            raise exc.NotFound(f"Cannot {action} job {job.uuid} ({job.name}): it is not on"
                               f" board '{self.name}'")
        owner = snap.live_owner(self._clock.now())
        if owner is None:
            expired = f" (the claim of '{snap.lock_owner}' expired)" if snap.lock_owner else ""
            raise exc.NotFound(f"Cannot {action} job {job.uuid} ({job.name}) as '{who}': it is"
                               f" not claimed{expired}")
        if owner != who:
            raise exc.JobFailure(f"Cannot {action} job {job.uuid} ({job.name}) as '{who}': it is"
                                 f" claimed by '{owner}'")
        return snap

    @base.check_who
    def keep_alive(self, job: base.Job, who: str) -> None:
        """Renew ``who``'s claim (rewrites the job node; its session must be the claim's).

        Raises:
            ClaimLost: If the claim is gone, expired, taken over, or made by a session that
                ended.
        """
        client = self._require()

        def lost(why: str) -> base.ClaimLost:
            return base.ClaimLost(f"'{who}' lost its claim on job {job.uuid} ({job.name}):"
                                  f" {why}", job.uuid, who)

        try:
            snap = self._read(self._path_of(job))
        except exc.NotFound:
            raise lost("it is not on the board") from None
        if snap.data is None:
            raise lost("it is not on the board")
        end = snap.lease_end()
        if snap.lock_owner != who or end is None or snap.lock_stat.ephemeralOwner \
                != client.client_id[0]:
            raise lost("its lock is gone or belongs to another session")
        txn = client.transaction()
        txn.set_data(snap.path, rec.encode(snap.data), version=snap.stat.version)
        txn.check(snap.path + self.LOCK_POSTFIX, version=snap.lock_stat.version)
        sent = self._clock.wall()
        try:
            stat = kazoo_utils.checked_commit(txn)[0]
        except kazoo_utils.KazooTransactionException as err:
            raise lost("another owner took it over") from err
        except k_exc.SessionExpiredError as err:
            raise lost("the ZooKeeper session expired") from err
        except (client.handler.timeout_exception, k_exc.KazooException) as err:
            raise exc.JobFailure(f"Cannot renew the claim on job {job.uuid} ({job.name}):"
                                 f" {type(err).__name__} {err}") from err
        self._clock.observe(stat.mtime, sent, self._clock.wall())
        if stat.mtime / 1000.0 > end:
            # Renewed after it had lapsed: others may have seen it free; give it up.
            with contextlib.suppress(exc.TaskFlowException):
                self.abandon(job, who)
            raise lost("it expired before this renewal")
        self._read(snap.path)

    @base.check_who
    def consume(self, job: base.Job, who: str) -> None:
        """Remove a finished job (see :meth:`JobBoard.consume`)."""
        snap = self._owned(job, who, "consume")
        txn = self._require().transaction()
        txn.delete(snap.path + self.LOCK_POSTFIX, version=snap.lock_stat.version)
        txn.delete(snap.path, version=snap.stat.version)
        with self._failures("consume", job):
            self._commit(txn, "consume", job)
        self._forget(snap.path)

    @base.check_who
    def abandon(self, job: base.Job, who: str, counted: bool = True) -> None:
        """Release ``who``'s claim (see :meth:`JobBoard.abandon`)."""
        snap = self._owned(job, who, "abandon")
        attempts = snap.attempts
        limit = self.options.max_attempts
        if counted and limit and attempts >= limit:
            self._to_trash(snap, job, f"abandoned or orphaned {attempts} times")
            return
        assert snap.data is not None
        data = {k: v for k, v in snap.data.items() if k != rec.CLAIM}
        data[rec.ATTEMPTS] = attempts if counted else max(attempts - 1, 0)
        txn = self._require().transaction()
        txn.delete(snap.path + self.LOCK_POSTFIX, version=snap.lock_stat.version)
        txn.set_data(snap.path, rec.encode(data), version=snap.stat.version)
        with self._failures("abandon", job):
            self._commit(txn, "abandon", job)
        self._read(snap.path)

    @base.check_who
    def trash(self, job: base.Job, who: str, reason: str = "", counted: bool = True) -> None:
        """Move a claimed job to the trash (see :meth:`JobBoard.trash`)."""
        snap = self._owned(job, who, "trash")
        self._to_trash(snap, job, reason or f"trashed by {who}",
                       snap.attempts if counted else max(snap.attempts - 1, 0))

    def _to_trash(self, snap: rec.Snapshot, job: base.Job, reason: str,
                  attempts: int | None = None) -> None:
        txn = self._require().transaction()
        self._trash.move_in(txn, snap, reason, attempts)
        if snap.lock is not None:
            txn.delete(snap.path + self.LOCK_POSTFIX, version=snap.lock_stat.version)
        txn.delete(snap.path, version=snap.stat.version)
        with self._failures("trash", job):
            self._commit(txn, "trash", job)
        self._forget(snap.path)

    def _forget(self, path: str) -> None:
        self._leases.forget(path)
        self._watch.forget(path)
        self._notify_change()
