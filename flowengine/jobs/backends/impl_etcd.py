"""The etcd jobboard (through etcd3gw): TaskFlow's keys, claims bound to etcd leases, a watch.

Keys, TaskFlow's, for a board ``path`` (conf key; ``jobboard`` by default):

===============================================  ===============================================
``/taskflow/jobs/<path>/sequence``               the last job number given
``/taskflow/jobs/<path>/job<N>.data``            a job's posting (JSON)
``/taskflow/jobs/<path>/job<N>.lock``            its claim ``{"owner", "lease_id"}``, bound to
                                                 the claim's lease
``/taskflow/jobs/<path>/job<N>.last_modified``   when it was last claimed
``/taskflow/jobs/<path>/job<N>.attempts``        claims so far (flowengine)
``/taskflow/jobs/<path>/job<N>.fencing_token``   its last claim's fencing token (flowengine)
``/taskflow/.trash/<path>/job<N>``               a trashed job: its posting plus ``trashed``
``/taskflow/.entities/<path>/<kind>/<name>``     a registered entity, bound to a lease
===============================================  ===============================================

A claim is an etcd lease of ``claim_ttl`` seconds (conf ``claim_ttl``, or TaskFlow's ``ttl``;
whole seconds, rounded up), renewed by :meth:`EtcdJobBoard.keep_alive`; etcd itself deletes
the lock when the lease runs out. Waiting is pushed: one watch on the board's prefix sees every
post, claim, release, removal and expiry as it happens.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import base, records
from flowengine.jobs.backends import _etcd_keys as keys
from flowengine.jobs.backends._etcd_keys import EtcdJob
from flowengine.jobs.backends._etcd_store import EtcdStore, make_client
from flowengine.jobs.backends._etcd_watch import Events, PrefixWatch
from flowengine.jobs.backends._json_values import new_posting
from flowengine.persistence.base import Backend
from flowengine.types.entity import Entity

if TYPE_CHECKING:
    import etcd3gw

    from flowengine.persistence import models

__all__ = ["EtcdJob", "EtcdJobBoard"]

LOG = logging.getLogger(__name__)


class EtcdJobBoard(base.NotifyingJobBoard):
    """A jobboard on etcd 3 through its HTTP gateway (conf: TaskFlow's ``host``, ``port``,
    ``protocol``, ``ca_cert``, ``cert_key``, ``cert_cert``, ``timeout``, ``api_path``, ``path``
    and ``ttl``; plus ``claim_ttl`` and ``max_attempts``).

    Args:
        name: The board's name.
        conf: The conf (see above).
        client: An etcd3gw client to use instead of one built from ``conf``.
        persistence: The persistence backend jobs' logbooks are loaded from.
    """

    ROOT_PATH = "/taskflow/jobs"
    TRASH_PATH = "/taskflow/.trash"
    ENTITY_PATH = "/taskflow/.entities"
    DEFAULT_PATH = "jobboard"
    JOB_PREFIX = "job"
    SEQUENCE_KEY = "sequence"
    DATA_POSTFIX = keys.DATA_POSTFIX
    LOCK_POSTFIX = keys.LOCK_POSTFIX
    LAST_MODIFIED_POSTFIX = keys.LAST_MODIFIED_POSTFIX

    def __init__(self, name: str, conf: dict[str, Any], client: etcd3gw.Etcd3Client | None = None,
                 persistence: Backend | None = None) -> None:
        super().__init__(name, conf, persistence)
        if self._conf.get("claim_ttl") is None and self._conf.get("ttl") is not None:
            self.options = dataclasses.replace(
                self.options, claim_ttl=base.BoardOptions.from_conf(
                    {"claim_ttl": self._conf["ttl"]}).claim_ttl)
        path = str(self._conf.get("path") or self.DEFAULT_PATH).strip("/")
        if not path:
            raise ValueError("etcd jobboard path must name a folder (like 'jobboard'), not '/'")
        self._root = f"{self.ROOT_PATH}/{path}"
        self._trash_root = f"{self.TRASH_PATH}/{path}/"
        self._entity_root = f"{self.ENTITY_PATH}/{path}/"
        self._client = client
        self._owns_client = client is None
        self._store: EtcdStore | None = None
        self._watch: PrefixWatch | None = None
        self._lock = threading.Lock()
        self._known: dict[str, EtcdJob] = {}
        #: Jobs the cache took from a write (this board's post, a watch event) -> the write's
        #: revision, and jobs it dropped on a write (a consume, a trash, a watch event) -> the
        #: same; kept until a listing read at or after that revision is applied. A listing read
        #: before the write is stale for that job: it neither drops nor brings the job back.
        self._added_at: dict[str, int] = {}
        self._gone_at: dict[str, int] = {}
        self._damaged: set[str] = set()
        self._entity_leases: dict[str, int] = {}

    @property
    def root(self) -> str:
        """Where the board's jobs live."""
        return self._root

    def _location(self) -> str:
        return self._root

    @property
    def connected(self) -> bool:
        """Whether :meth:`connect` ran and :meth:`close` did not."""
        return self._store is not None

    def connect(self) -> None:
        """Check etcd answers, read the board and start watching it.

        Raises:
            flowengine.exceptions.JobFailure: If etcd cannot be reached.
        """
        if self._store is not None:
            return
        if self._client is None:
            self._client = make_client(self._conf)
        store = EtcdStore(self._client, self.name)
        self._store = store
        self._watch = PrefixWatch(self._client, self._root + "/", self._reload,
                                  self._on_events, self.name)
        try:
            self._watch.start()
        except exc.JobFailure:
            self._store, self._watch = None, None
            raise

    def close(self) -> None:
        """Stop watching and forget the cache (claims held then run out on their own)."""
        if self._store is None:
            return
        watch, self._watch, self._store = self._watch, None, None
        if watch is not None:
            watch.stop()
        if self._owns_client and self._client is not None:
            self._client.session.close()  # its pooled connections; a new connect reopens them
        with self._lock:
            self._known.clear()
            self._added_at.clear()
            self._gone_at.clear()
            self._entity_leases.clear()
        self._notify_change()

    def _require(self) -> EtcdStore:
        if self._store is None:
            raise exc.JobFailure(f"Jobboard '{self.name}' is not connected")
        return self._store

    # ---- following changes ---------------------------------------------------------------------

    def _job(self, key: str, raw: bytes) -> EtcdJob | None:
        """The job ``key`` holds; None if its posting is damaged (reported, and trashed by
        :meth:`_trash_damaged` once out of the board's lock)."""
        try:
            data = records.read_posting(raw)
            job = EtcdJob.from_posting(self, {k: v for k, v in data.items() if k != "sequence"},
                                       backend=self._persistence, key=key,
                                       sequence=int(data.get("sequence") or 0))
        except (KeyError, TypeError, ValueError) as err:
            if self._damage.found(key, str(err)):
                self._damaged.add(key)
            return None
        self._damage.cleared(key)
        return job

    def _trash_damaged(self) -> None:
        """Move the damaged postings found since last time to the trash, each only if it is
        unchanged since read again here and nobody holds its lock."""
        with self._lock:
            pending, self._damaged = self._damaged, set()
        for key in sorted(pending):
            try:
                snap = keys.Snapshot.of(key, self._require().range(key + ".", "read " + key)[0])
                if snap.data is None:
                    self._damage.cleared(key)
                    continue
                try:
                    records.read_posting(snap.data.value)
                    continue  # repaired meanwhile: the next read takes it
                except records.PostingError as err:
                    why = f"damaged posting: {err}"
                record = dict(records.damaged_posting(key, snap.data.value, why), trashed={
                    "reason": why, "attempts": 0, "trashed_on": base.utcnow().isoformat()})
                moved = self._require().txn(
                    [keys.missing(key + self.LOCK_POSTFIX), keys.same(key + self.DATA_POSTFIX,
                                                                      snap.data)],
                    [keys.put(self._trash_root + key.rpartition("/")[2], keys.encode(record)),
                     keys.delete_prefix(key + ".")], f"trash the damaged posting {key}")
            except exc.JobFailure as err:
                LOG.debug("Jobboard %s left the damaged posting %s on the board: %s",
                          self.name, key, err)
                continue
            if moved:
                self._damage.trashed(key)

    def _sync(self, postings: dict[str, bytes], revision: int) -> list[EtcdJob]:
        """Bring the cache in line with the ``.data`` keys read at ``revision``; announce what
        changed."""
        changes: list[tuple[str, EtcdJob]] = []
        with self._lock:
            for key in [k for k in self._known if k not in postings]:
                if self._added_at.get(key, 0) <= revision:
                    changes.append((base.REMOVAL, self._known.pop(key)))
            for key, raw in postings.items():
                if key not in self._known and self._gone_at.get(key, 0) <= revision \
                        and (job := self._job(key, raw)) is not None:
                    self._known[key] = job
                    changes.append((base.POSTED, job))
            jobs = list(self._known.values())
            self._added_at = {k: r for k, r in self._added_at.items() if r > revision}
            self._gone_at = {k: r for k, r in self._gone_at.items() if r > revision}
        self._announce(changes)
        self._trash_damaged()
        return jobs

    def _announce(self, changes: list[tuple[str, EtcdJob]]) -> None:
        for event, job in changes:
            self.notifier.notify(event, {"job": job})

    def _read_postings(self, values: bool = True) -> tuple[dict[str, bytes], set[str], int]:
        """The board's postings by job key (empty values unless ``values``), the keys of the
        claimed jobs, and the revision read at: one range request."""
        found, revision = self._require().range(f"{self._root}/{self.JOB_PREFIX}", "list jobs",
                                                keys_only=not values)
        postings = {kv.key[:-len(self.DATA_POSTFIX)]: kv.value for kv in found
                    if kv.key.endswith(self.DATA_POSTFIX)}
        claimed = {kv.key[:-len(self.LOCK_POSTFIX)] for kv in found
                   if kv.key.endswith(self.LOCK_POSTFIX)}
        return postings, claimed, revision

    def _reload(self) -> int:
        postings, _, revision = self._read_postings()
        self._sync(postings, revision)
        self._notify_change()
        return revision

    def _on_events(self, events: Events) -> None:
        changes: list[tuple[str, EtcdJob]] = []
        with self._lock:
            for kind, kv in events:
                if not kv.key.endswith(self.DATA_POSTFIX):
                    continue  # a claim, release or expiry: only waiters care
                key = kv.key[:-len(self.DATA_POSTFIX)]
                if kind == "DELETE":
                    self._added_at.pop(key, None)
                    self._gone_at[key] = max(self._gone_at.get(key, 0), kv.mod_revision)
                    if (gone := self._known.pop(key, None)) is not None:
                        changes.append((base.REMOVAL, gone))
                elif key not in self._known and (job := self._job(key, kv.value)) is not None:
                    self._known[key] = job
                    self._added_at[key] = kv.mod_revision
                    changes.append((base.POSTED, job))
        self._announce(changes)
        self._trash_damaged()
        self._notify_change()

    # ---- reading -------------------------------------------------------------------------------

    def _lease_ttl(self, lease: int) -> int:
        return self._require().time_to_live(lease, "read a claim's lease")

    def _renew_lease(self, lease: int) -> int:
        return self._require().refresh(lease, "renew a claim")

    def _key_of(self, job: base.Job) -> str:
        if not isinstance(job, EtcdJob):
            raise exc.NotFound(f"Job {job.uuid} ({job.name}) is not a job of etcd board"
                               f" '{self.name}'")
        return job.key

    def _read(self, job: base.Job) -> keys.Snapshot:
        key = self._key_of(job)
        found, _ = self._require().range(key + ".", f"read job {job.uuid} ({job.name})")
        return keys.Snapshot.of(key, found)

    def iterjobs(self, only_unclaimed: bool = False,
                 ensure_fresh: bool = False) -> Iterator[base.Job]:
        """Jobs on the board, most urgent then oldest first (see :meth:`JobBoard.iterjobs`)."""
        self._require()

        def fetch(fresh: bool) -> list[tuple[base.Job, str]]:
            # One range read gives the listing and every job's state with it.
            postings, claimed, revision = self._read_postings(values=fresh)
            if fresh:
                jobs = self._sync(postings, revision)
            else:
                with self._lock:
                    jobs = list(self._known.values())
            jobs.sort(key=lambda j: (j.priority.rank, j.sequence))
            return [(job, states.COMPLETE if job.key not in postings else
                     states.CLAIMED if job.key in claimed else states.UNCLAIMED) for job in jobs]

        return base.JobBoardIterator(self, fetch, only_unclaimed, ensure_fresh)

    @property
    def job_count(self) -> int:
        """How many jobs the board's cache holds (kept current by the watch)."""
        with self._lock:
            return len(self._known)

    def find_owner(self, job: base.Job) -> str | None:
        """Who holds the claim on ``job``; raises NotFound if it is gone."""
        snap = self._read(job)
        if snap.data is None:
            raise exc.NotFound(f"Job {job.uuid} ({job.name}) is not on board '{self.name}'")
        return snap.owner

    # ---- changing ------------------------------------------------------------------------------

    def _put_posting(self, posting: dict[str, Any], what: str,
                     also_if: list[dict[str, Any]], also: list[dict[str, Any]]
                     ) -> tuple[EtcdJob, int]:
        """Store a new posting; the job and the revision it was stored at."""
        key, stored, revision = self._require().put_numbered(self._root, posting, what,
                                                             also_if, also)
        job = self._job(key, keys.encode(stored))
        assert job is not None
        return job, revision

    def post(self, name: str, book: models.LogBook | None = None,
             details: dict[str, Any] | None = None,
             priority: base.JobPriority | str = base.JobPriority.NORMAL) -> base.Job:
        """Post a job (details must be JSON-ready); every watching board is woken."""
        posting, _ = new_posting(name, book, details, priority)
        job, revision = self._put_posting(posting, f"post job '{name}'", [], [])
        job._book = book
        with self._lock:
            fresh = self._known.setdefault(job.key, job) is job
            self._added_at[job.key] = max(self._added_at.get(job.key, 0), revision)
        if fresh:
            self.notifier.notify(base.POSTED, {"job": job})
        return job

    @base.check_who
    def claim(self, job: base.Job, who: str, expiry: float | None = None) -> int:
        """Claim ``job`` under a new lease of ``expiry`` or ``claim_ttl`` seconds (whole seconds,
        rounded up; see :meth:`JobBoard.claim`); :meth:`keep_alive` renews it for as long.

        The fencing token returned is written by the claim's own transaction, on condition that
        the job's last one is unchanged: above it, and at least this process's clock in
        microseconds (etcd offers no clock; :func:`~flowengine.jobs.records.fencing_token`).
        """
        ttl = self._lease_seconds(expiry)
        store = self._require()
        snap = self._read(job)
        if snap.data is None:
            raise exc.NotFound(f"Cannot claim job {job.uuid} ({job.name}): it is not on board"
                               f" '{self.name}'")
        if snap.lock is not None:
            raise exc.UnclaimableJob(f"Job {job.uuid} ({job.name}) is already claimed by"
                                     f" '{snap.owner}'")
        limit = self.options.max_attempts
        if limit and snap.tries >= limit:
            self._to_trash(snap, job, f"abandoned or orphaned {snap.tries} times")
            raise exc.UnclaimableJob(f"Job {job.uuid} ({job.name}) was moved to the trash: it was"
                                     f" abandoned or orphaned {snap.tries} times")
        what = f"claim job {job.uuid} ({job.name})"
        lease = store.grant(ttl, what)
        modified = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        token = records.fencing_token(snap.last_token, time.time())
        claimed = store.txn(
            [keys.exists(snap.key + self.DATA_POSTFIX), keys.missing(snap.key + self.LOCK_POSTFIX),
             keys.same(snap.key + keys.ATTEMPTS_POSTFIX, snap.attempts),
             keys.same(snap.key + keys.TOKEN_POSTFIX, snap.token)],
            [keys.put(snap.key + self.LOCK_POSTFIX,
                      keys.encode({"owner": who, "lease_id": lease}), lease),
             keys.put(snap.key + keys.ATTEMPTS_POSTFIX, str(snap.tries + 1).encode()),
             keys.put(snap.key + keys.TOKEN_POSTFIX, str(token).encode()),
             keys.put(snap.key + self.LAST_MODIFIED_POSTFIX, keys.encode(
                 {"last_modified": modified.strftime(keys.LAST_MODIFIED_FORMAT)}))], what)
        if not claimed:
            store.revoke(lease)
            now = self._read(job)
            if now.data is None:
                raise exc.NotFound(f"Cannot claim job {job.uuid} ({job.name}): it is not on"
                                   f" board '{self.name}'")
            held = f"claimed by '{now.owner}'" if now.owner else "changed meanwhile"
            raise exc.UnclaimableJob(f"Job {job.uuid} ({job.name}) is already {held}")
        return token

    @base.check_who
    def keep_alive(self, job: base.Job, who: str) -> None:
        """Renew ``who``'s claim lease (see :meth:`JobBoard.keep_alive`)."""
        store = self._require()

        def lost(why: str) -> base.ClaimLost:
            return base.ClaimLost(f"'{who}' lost its claim on job {job.uuid} ({job.name}):"
                                  f" {why}", job.uuid, who)

        lock = store.get(self._key_of(job) + self.LOCK_POSTFIX,
                         f"read the claim on job {job.uuid}")
        if lock is None:
            raise lost("it expired or was released")
        owner = keys.decode(lock.value).get("owner")
        if owner != who:
            raise lost(f"it is claimed by '{owner}'")
        if not lock.lease or store.refresh(lock.lease, f"renew the claim on job {job.uuid}") <= 0:
            raise lost("its lease expired")

    def _owned(self, job: base.Job, who: str, action: str) -> keys.Snapshot:
        snap = self._read(job)
        if snap.data is None:
            raise exc.NotFound(f"Cannot {action} job {job.uuid} ({job.name}): it is not on"
                               f" board '{self.name}'")
        if snap.owner is None:
            raise exc.NotFound(f"Cannot {action} job {job.uuid} ({job.name}) as '{who}': it is"
                               f" not claimed")
        if snap.owner != who:
            raise exc.JobFailure(f"Cannot {action} job {job.uuid} ({job.name}) as '{who}': it is"
                                 f" claimed by '{snap.owner}'")
        return snap

    def _release(self, snap: keys.Snapshot, job: base.Job, action: str,
                 then: list[dict[str, Any]]) -> int:
        """Run ``then`` if the claim ``snap`` shows is unchanged; end its lease. The revision
        ``then`` was written at."""
        store = self._require()
        revision = store.txn_at([keys.same(snap.key + self.LOCK_POSTFIX, snap.lock)], then,
                                f"{action} job {job.uuid} ({job.name})")
        if revision is None:
            raise exc.JobFailure(f"Cannot {action} job {job.uuid} ({job.name}): its claim ended"
                                 f" meanwhile")
        if snap.lock is not None and snap.lock.lease:
            store.revoke(snap.lock.lease)
        return revision

    def _forget(self, key: str, revision: int) -> None:
        """Drop a job this board removed from etcd at ``revision``."""
        with self._lock:
            self._added_at.pop(key, None)
            self._gone_at[key] = max(self._gone_at.get(key, 0), revision)
            job = self._known.pop(key, None)
        if job is not None:
            self.notifier.notify(base.REMOVAL, {"job": job})

    @base.check_who
    def consume(self, job: base.Job, who: str) -> None:
        """Remove a finished job (see :meth:`JobBoard.consume`)."""
        snap = self._owned(job, who, "consume")
        self._forget(snap.key, self._release(snap, job, "consume",
                                             [keys.delete_prefix(snap.key + ".")]))

    @base.check_who
    def abandon(self, job: base.Job, who: str, counted: bool = True) -> None:
        """Release ``who``'s claim (see :meth:`JobBoard.abandon`)."""
        snap = self._owned(job, who, "abandon")
        limit = self.options.max_attempts
        if counted and limit and snap.tries >= limit:
            self._to_trash(snap, job, f"abandoned or orphaned {snap.tries} times")
            return
        then = [keys.delete(snap.key + self.LOCK_POSTFIX)]
        if not counted:
            then.append(keys.put(snap.key + keys.ATTEMPTS_POSTFIX,
                                 str(max(snap.tries - 1, 0)).encode()))
        self._release(snap, job, "abandon", then)

    @base.check_who
    def trash(self, job: base.Job, who: str, reason: str = "", counted: bool = True) -> None:
        """Move a claimed job to the trash (see :meth:`JobBoard.trash`)."""
        snap = self._owned(job, who, "trash")
        self._to_trash(snap, job, reason or f"trashed by {who}",
                       snap.tries if counted else max(snap.tries - 1, 0))

    def _to_trash(self, snap: keys.Snapshot, job: base.Job, reason: str,
                  attempts: int | None = None) -> None:
        assert snap.data is not None
        data = dict(keys.decode(snap.data.value), trashed={
            "reason": reason, "attempts": snap.tries if attempts is None else attempts,
            "trashed_on": base.utcnow().isoformat()})
        trash_key = self._trash_root + snap.key.rpartition("/")[2]
        then = [keys.put(trash_key, keys.encode(data)), keys.delete_prefix(snap.key + ".")]
        if snap.lock is None:  # trashed on the way to a claim: nobody may have claimed it since
            revision = self._require().txn_at(
                [keys.missing(snap.key + self.LOCK_POSTFIX),
                 keys.same(snap.key + self.DATA_POSTFIX, snap.data)],
                then, f"trash job {job.uuid} ({job.name})")
            if revision is None:
                raise exc.UnclaimableJob(f"Job {job.uuid} ({job.name}) changed meanwhile")
        else:
            revision = self._release(snap, job, "trash", then)
        self._forget(snap.key, revision)

    # ---- TaskFlow's key helpers ----------------------------------------------------------------

    def get_one(self, key: str) -> bytes | None:
        """The value of etcd key ``key`` (None if it does not exist)."""
        found = self._require().get(key, f"read key {key}")
        return None if found is None else found.value

    def incr(self, key: str) -> int:
        """Add one to the counter at etcd key ``key`` (missing: 0), atomically; the new value."""
        return self._require().increment(key, f"increment key {key}")

    # ---- the trash and the entities ------------------------------------------------------------

    def _trash_items(self) -> list[keys.KV]:
        return self._require().range(self._trash_root, "list its trash")[0]

    def _trashed(self, job_uuid: str) -> keys.KV:
        for kv in self._trash_items():
            if keys.decode(kv.value).get("uuid") == job_uuid:
                return kv
        raise exc.NotFound(f"No trashed job {job_uuid} on board '{self.name}'")

    def iter_trash(self) -> list[base.TrashedJob]:
        """The trashed jobs, oldest first."""
        trashed = [t for t in (keys.trashed_job(kv.value) for kv in self._trash_items()) if t]
        return sorted(trashed, key=lambda t: t.trashed_on)

    def repost(self, job_uuid: str) -> base.Job:
        """Put a trashed job back on the board, unclaimed, with no attempts counted."""
        kv = self._trashed(job_uuid)
        data = keys.decode(kv.value)
        posting = {k: v for k, v in data.items() if k not in ("trashed", "sequence")}
        posting["last_modified"] = base.utcnow().isoformat()
        job, _ = self._put_posting(posting, f"repost trashed job {job_uuid}",
                                   [keys.same(kv.key, kv)], [keys.delete(kv.key)])
        return job

    def discard(self, job_uuid: str) -> None:
        """Delete a trashed job for good."""
        kv = self._trashed(job_uuid)
        if not self._require().txn([keys.same(kv.key, kv)], [keys.delete(kv.key)],
                                   f"discard trashed job {job_uuid}"):
            raise exc.NotFound(f"No trashed job {job_uuid} on board '{self.name}' (reposted or"
                               f" discarded meanwhile)")

    def _entity_key(self, entity: Entity) -> str:
        return f"{self._entity_root}{entity.kind}/{entity.name}"

    def register_entity(self, entity: Entity) -> None:
        """Record ``entity`` under a ``claim_ttl`` lease; again: renew it (and its metadata)."""
        store = self._require()
        key = self._entity_key(entity)
        what = f"register {entity.kind} '{entity.name}'"
        with self._lock:
            lease = self._entity_leases.get(key)
        if lease is None or store.refresh(lease, what) <= 0:
            lease = store.grant(self.options.claim_ttl, what)
        store.txn([], [keys.put(key, keys.encode(entity.to_dict()), lease)], what)
        with self._lock:
            self._entity_leases[key] = lease

    def unregister_entity(self, entity: Entity) -> None:
        """Forget ``entity`` now."""
        store = self._require()
        key = self._entity_key(entity)
        with self._lock:
            lease = self._entity_leases.pop(key, None)
        store.txn([], [keys.delete(key)], f"unregister {entity.kind} '{entity.name}'")
        if lease is not None:
            store.revoke(lease)

    def iter_entities(self, kind: str | None = None) -> list[Entity]:
        """The registered entities whose lease is alive, sorted by kind and name."""
        prefix = self._entity_root + (f"{kind}/" if kind else "")
        found = [keys.decode(kv.value) for kv in self._require().range(prefix, "list entities")[0]]
        entities = [Entity.from_dict(d) for d in found if "kind" in d and "name" in d]
        return sorted(entities, key=lambda e: (e.kind, e.name))
