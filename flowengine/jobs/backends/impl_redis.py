"""The Redis jobboard: claims are keys that expire, changes are published.

Layout under the ``namespace`` (conf key; default ``flowengine``):

=============================  ==============================================================
``<ns>:jobs``                  hash: job uuid -> posting (JSON, :func:`~..base.format_posting`)
``<ns>:attempts``              hash: job uuid -> claims so far
``<ns>:claim:<uuid>``          the claim: its owner, expiring after ``claim_ttl`` (a lease)
``<ns>:fencing-token``         the last claim's fencing token (see :meth:`RedisJobBoard.claim`)
``<ns>:trash``, ``<ns>:trash-info``   hashes: trashed postings, and why / when / attempts
``<ns>:entities``              hash: ``kind:name`` -> a registered entity (JSON)
``<ns>:entity-expiries``       sorted set: ``kind:name`` -> when it lapses (server clock, ms)
``<ns>:events``                the channel every change is published on
=============================  ==============================================================

Every operation is one Lua script (:mod:`._redis_scripts`), so it is atomic on the server.
Behind Sentinels (conf ``sentinel``: the master's name) a post returns only once a replica has
it too (``WAIT``; conf ``min_replicas``, default 1 there, and ``replica_timeout`` seconds, default
2): Redis replicates asynchronously, and a failover would otherwise lose a job its poster was
told was posted. A claim the promoted replica never received is gone after a failover: its
holder's next keep-alive finds so (:class:`~..base.ClaimLost`), it stops before its next atom,
and another conductor claims the job.
Waiting is pushed: a thread follows the channel and wakes waiters; a claim that ends by expiry
is not announced by Redis (without keyspace notifications), so waiters also sleep until the end
of the soonest lease they know of, which is a timer set from the claim's own TTL, not polling.
After a lost connection the thread reconnects with capped backoff and re-reads everything, so
no change missed meanwhile is lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid as uuidlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import base, records
from flowengine.types.entity import Entity
from flowengine.utils import redis_utils

import redis  # isort: skip  (redis_utils above names the extra when it is missing)

from flowengine.jobs.backends import _redis_scripts as scripts
from flowengine.jobs.backends._json_values import new_posting
from flowengine.jobs.backends._lease_times import LeaseTimes
from flowengine.persistence.base import Backend

if TYPE_CHECKING:
    from flowengine.persistence import models

__all__ = ["RedisJob", "RedisJobBoard"]

LOG = logging.getLogger(__name__)

_RECONNECT_DELAYS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


class RedisJob(base.Job):
    """A job on a :class:`RedisJobBoard`; state and attempts are read from Redis."""

    @property
    def state(self) -> str:
        """UNCLAIMED, CLAIMED or COMPLETE (gone)."""
        assert isinstance(self._board, RedisJobBoard)
        return self._board._job_state(self.uuid)

    @property
    def attempts(self) -> int:
        """Claims so far."""
        assert isinstance(self._board, RedisJobBoard)
        return self._board._attempts(self.uuid)


class RedisJobBoard(base.NotifyingJobBoard):
    """A jobboard on Redis (TaskFlow's conf keys: host, port, password, db, namespace, sentinel
    settings, ssl settings; plus ``claim_ttl`` and ``max_attempts``).

    Args:
        name: The board's name.
        conf: The conf (see above).
        client: A Redis client to use instead of one built from ``conf`` (not closed by
            :meth:`close`).
        persistence: The persistence backend jobs' logbooks are loaded from.
    """

    DEFAULT_NAMESPACE = "flowengine"
    #: The oldest Redis the board works with (server-side Lua scripts came with 2.6).
    MIN_REDIS_VERSION = (2, 6)

    def __init__(self, name: str, conf: dict[str, Any], client: redis.Redis | None = None,
                 persistence: Backend | None = None) -> None:
        super().__init__(name, conf, persistence)
        self._owns_client = client is None
        # Built now (it connects only when used), so that a bad conf fails here.
        self._client: redis.Redis | None = (
            client if client is not None else redis_utils.make_client(self._conf))
        ns = str(self._conf.get("namespace") or self.DEFAULT_NAMESPACE)
        self._ns = ns
        self._channel = f"{ns}:events"
        self._keys = [f"{ns}:jobs", f"{ns}:attempts", f"{ns}:trash", f"{ns}:trash-info"]
        self._fencing_key = f"{ns}:fencing-token"
        self._scripts: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, Any]] = {}
        self._leases = LeaseTimes()
        self._listener: threading.Thread | None = None
        self._stopping = threading.Event()
        self._following = threading.Event()
        self._stop_channel = ""
        self._connected = False
        self._min_replicas = int(self._conf.get("min_replicas",
                                                1 if self._conf.get("sentinel") else 0))
        self._replica_timeout = float(self._conf.get("replica_timeout", 2.0))

    def _location(self) -> str:
        return self._ns

    # ---- connection ----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether :meth:`connect` ran and :meth:`close` did not."""
        return self._connected

    def connect(self) -> None:
        """Connect, check the server answers, and start following the board's changes.

        Raises:
            flowengine.exceptions.JobFailure: If Redis cannot be reached.
        """
        if self._connected:
            return
        if self._client is None:
            self._client = redis_utils.make_client(self._conf)
        try:
            self._client.ping()
            new_enough, version = redis_utils.is_server_new_enough(self._client,
                                                                   self.MIN_REDIS_VERSION)
        except redis.RedisError as err:
            raise exc.JobFailure(f"Cannot connect jobboard '{self.name}' to Redis: {err}") \
                from err
        if not new_enough:
            wanted = ".".join(str(part) for part in self.MIN_REDIS_VERSION)
            raise exc.IncompatibleVersion(f"Jobboard '{self.name}' needs Redis {wanted} or"
                                          f" later, not {version or 'an unknown version'}")
        self._scripts = {name: self._client.register_script(getattr(scripts, name))
                         for name in ("CLAIM", "KEEP_ALIVE", "CONSUME", "ABANDON", "TRASH",
                                      "TRASH_DAMAGED", "REPOST", "DISCARD", "POST",
                                      "REGISTER", "LIVE_ENTITIES")}
        self._stopping.clear()
        self._stop_channel = f"{self._ns}:stop:{uuidlib.uuid4().hex}"
        pubsub = self._client.pubsub()
        pubsub.subscribe(self._channel, self._stop_channel)
        self._connected = True
        self._listener = threading.Thread(target=self._follow, args=(pubsub,), daemon=True,
                                          name=f"jobboard-{self.name}")
        self._listener.start()
        self._following.wait(5.0)

    def close(self) -> None:
        """Stop following changes and disconnect (claims held are left to expire)."""
        if not self._connected:
            return
        self._connected = False
        self._stopping.set()
        assert self._client is not None
        try:
            self._client.publish(self._stop_channel, "stop")
        except redis.RedisError:
            LOG.debug("Jobboard %s: Redis unreachable while closing", self.name)
        if self._listener is not None:
            self._listener.join(5.0)
        if self._owns_client:
            self._client.close()
            self._client = None
        self._notify_change()

    # ---- following changes ---------------------------------------------------------------------

    def _follow(self, pubsub: Any) -> None:
        failures = 0
        try:
            while not self._stopping.is_set():
                try:
                    message = pubsub.get_message(timeout=None)
                except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
                    delay = _RECONNECT_DELAYS[min(failures, len(_RECONNECT_DELAYS) - 1)]
                    failures += 1
                    LOG.warning("Jobboard %s lost Redis (%s); reconnecting in %.2fs",
                                self.name, err, delay)
                    self._stopping.wait(delay)
                    continue
                failures = 0
                if message is None:
                    continue
                try:
                    self._on_message(message)
                except Exception:  # one bad message must not stop the board following
                    LOG.exception("Jobboard %s could not handle %r", self.name, message)
        finally:
            try:
                pubsub.close()
            except redis.RedisError:  # closing a dead connection
                pass

    def _on_message(self, message: dict[str, Any]) -> None:
        channel = _text(message.get("channel"))
        if message.get("type") == "subscribe":
            if channel == self._channel:
                # (Re)subscribed: anything published while we were away is lost, so re-read.
                self._reload()
                self._following.set()
            return
        if message.get("type") != "message" or channel != self._channel:
            return
        try:
            event = json.loads(_text(message["data"]))
        except ValueError:
            LOG.warning("Jobboard %s ignored a message that is not JSON on %s", self.name,
                        self._channel)
            return
        self._apply(event)
        self._notify_change()

    def _apply(self, event: dict[str, Any]) -> None:
        kind, job_uuid = event.get("event"), str(event.get("uuid"))
        job: base.Job | None = None
        with self._lock:
            if kind == "posted":
                posting = self._posting(job_uuid, event.get("posting") or "")
                if posting is not None:
                    self._cache[job_uuid] = posting
                    job = self._job(posting)
            elif kind == "removed":
                gone = self._cache.pop(job_uuid, None)
                self._leases.released(job_uuid)
                job = self._job(gone) if gone else None
            elif kind in ("claimed", "renewed"):
                self._leases.claimed(job_uuid, float(event["ttl_ms"]))
            elif kind == "released":
                self._leases.released(job_uuid)
        if job is not None:
            self.notifier.notify(base.POSTED if kind == "posted" else base.REMOVAL, {"job": job})

    def _reload(self) -> None:
        client = self._client
        if client is None:
            return
        try:
            postings = self._read_postings()
            with client.pipeline(transaction=False) as pipe:
                for job_uuid in postings:
                    pipe.pttl(self._claim_key(job_uuid))
                ttls = pipe.execute()
        except redis.RedisError as err:
            LOG.warning("Jobboard %s could not re-read the board: %s", self.name, err)
            return
        with self._lock:
            self._cache = postings
        self._leases.reset(dict(zip(postings, ttls, strict=True)))
        self._notify_change()

    def _next_wakeup(self) -> float | None:
        def remaining_ms(job_uuids: list[str]) -> list[int]:
            assert self._client is not None
            with self._client.pipeline(transaction=False) as pipe:
                for job_uuid in job_uuids:
                    pipe.pttl(self._claim_key(job_uuid))
                return [int(ttl) for ttl in pipe.execute()]

        return self._leases.next_wakeup(remaining_ms)

    # ---- reading -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _talking(self, action: str) -> Iterator[redis.Redis]:
        """The client, with Redis errors raised as JobFailure naming the board and ``action``."""
        client = self._require_client()
        try:
            yield client
        except redis.RedisError as err:
            raise exc.JobFailure(f"Jobboard '{self.name}' could not {action}: {err}") from err

    def _require_client(self) -> redis.Redis:
        if self._client is None or not self._connected:
            raise exc.JobFailure(f"Jobboard '{self.name}' is not connected")
        return self._client

    def _claim_key(self, job_uuid: str) -> str:
        return f"{self._ns}:claim:{job_uuid}"

    def _read_postings(self) -> dict[str, dict[str, Any]]:
        """The board's postings by uuid; a damaged one is skipped, reported and trashed."""
        assert self._client is not None
        postings: dict[str, dict[str, Any]] = {}
        for key, raw in self._client.hgetall(self._keys[0]).items():
            job_uuid = _text(key)
            posting = self._posting(job_uuid, raw)
            if posting is not None:
                postings[job_uuid] = posting
            elif self._damage.found(job_uuid, self._damaged_reason(job_uuid, raw)):
                self._trash_damaged(job_uuid, raw)
        return postings

    def _posting(self, job_uuid: str, raw: Any) -> dict[str, Any] | None:
        """The posting stored under ``job_uuid`` (None: damaged)."""
        try:
            posting = (records.read_posting(raw) if isinstance(raw, (bytes, str))
                       else records.check_posting(raw))
        except records.PostingError:
            return None
        if posting["uuid"] != job_uuid:
            return None
        self._damage.cleared(job_uuid)
        return posting

    @staticmethod
    def _damaged_reason(job_uuid: str, raw: bytes | str) -> str:
        try:
            posting = records.read_posting(raw)
        except records.PostingError as err:
            return str(err)
        return f"its 'uuid' is {posting['uuid']!r}, not the key it is stored under ({job_uuid})"

    def _trash_damaged(self, job_uuid: str, raw: bytes | str) -> None:
        """Move the damaged posting ``raw`` at ``job_uuid`` to the trash, if it is unchanged and
        nobody holds a claim on it."""
        reason = f"damaged posting: {self._damaged_reason(job_uuid, raw)}"
        record = dict(records.damaged_posting(job_uuid, raw, reason), uuid=job_uuid)
        info = {"reason": reason, "attempts": 0, "trashed_on": base.utcnow().isoformat()}
        try:
            status, _ = self._run("TRASH_DAMAGED", job_uuid, "", raw, json.dumps(record),
                                  json.dumps(info))
        except exc.JobFailure as err:
            LOG.debug("Jobboard %s could not trash the damaged posting %s: %s", self.name,
                      job_uuid, err)
            return
        if status == "trashed":
            self._damage.trashed(job_uuid)

    def _job(self, posting: dict[str, Any]) -> RedisJob:
        return RedisJob.from_posting(self, posting, backend=self._persistence)

    def _job_state(self, job_uuid: str) -> str:
        client = self._require_client()
        try:
            with client.pipeline(transaction=True) as pipe:
                pipe.hexists(self._keys[0], job_uuid)
                pipe.exists(self._claim_key(job_uuid))
                exists, claimed = pipe.execute()
        except redis.RedisError as err:
            raise exc.JobFailure(f"Cannot read the state of job {job_uuid}: {err}") from err
        if not exists:
            return states.COMPLETE
        return states.CLAIMED if claimed else states.UNCLAIMED

    def _states(self, job_uuids: list[str]) -> list[str]:
        """The states of many jobs in one round trip."""
        if not job_uuids:
            return []
        client = self._require_client()
        try:
            with client.pipeline(transaction=True) as pipe:
                for job_uuid in job_uuids:
                    pipe.hexists(self._keys[0], job_uuid)
                    pipe.exists(self._claim_key(job_uuid))
                answers = pipe.execute()
        except redis.RedisError as err:
            raise exc.JobFailure(f"Cannot read the jobs of board '{self.name}': {err}") from err
        return [states.COMPLETE if not exists else states.CLAIMED if claimed
                else states.UNCLAIMED for exists, claimed in zip(answers[::2], answers[1::2],
                                                                 strict=True)]

    def _attempts(self, job_uuid: str) -> int:
        with self._talking(f"read the attempts of job {job_uuid}") as client:
            value = client.hget(self._keys[1], job_uuid)
        try:
            return int(value) if value else 0
        except ValueError:  # a damaged counter counts as none, as the board's scripts read it
            return 0

    def iterjobs(self, only_unclaimed: bool = False,
                 ensure_fresh: bool = False) -> Iterator[base.Job]:
        """Jobs on the board, most urgent then oldest first (see :meth:`JobBoard.iterjobs`)."""
        self._require_client()

        def fetch(fresh: bool) -> list[tuple[base.Job, str]]:
            if fresh or not self._following.is_set():
                with self._talking("list its jobs"):
                    postings = list(self._read_postings().values())
            else:
                with self._lock:
                    postings = list(self._cache.values())
            jobs = sorted((self._job(p) for p in postings),
                          key=lambda j: (j.priority.rank, str(j.created_on), j.uuid))
            return list(zip(jobs, self._states([j.uuid for j in jobs]), strict=True))

        return base.JobBoardIterator(self, fetch, only_unclaimed, ensure_fresh)

    def find_owner(self, job: base.Job) -> str | None:
        """Who holds the claim on ``job``; raises NotFound if it is gone."""
        with self._talking(f"find the owner of job {job.uuid}") as client, \
                client.pipeline(transaction=True) as pipe:
            pipe.hexists(self._keys[0], job.uuid)
            pipe.get(self._claim_key(job.uuid))
            exists, owner = pipe.execute()
        if not exists:
            raise exc.NotFound(f"Job {job.uuid} is not on board '{self.name}'")
        return _text(owner) if owner else None

    # ---- changing ------------------------------------------------------------------------------

    def _run(self, script: str, job_uuid: str, who: str, *args: Any) -> tuple[str, str]:
        self._require_client()
        try:
            status, value = self._scripts[script](
                keys=[*self._keys, self._claim_key(job_uuid), self._fencing_key],
                args=[job_uuid, self._channel, who, *args])
        except redis.RedisError as err:
            raise exc.JobFailure(f"Jobboard '{self.name}' could not {script.lower()} job"
                                 f" {job_uuid}: {err}") from err
        return _text(status), _text(value)

    def _replicated(self, what: str) -> None:
        """Wait until ``min_replicas`` replicas have every write so far, or raise."""
        if self._min_replicas <= 0:
            return
        with self._talking(what) as client:
            copies = int(client.wait(self._min_replicas, int(self._replica_timeout * 1000)))
        if copies < self._min_replicas:
            raise exc.JobFailure(
                f"Jobboard '{self.name}' could not {what} safely: {copies} of the "
                f"{self._min_replicas} replica(s) it waits for had it after "
                f"{self._replica_timeout:g}s, so a failover could lose it (it may be on the "
                f"board: look before posting again)")

    def _refused(self, status: str, value: str, job: base.Job, who: str, action: str) -> None:
        if status == "missing":
            raise exc.NotFound(f"Cannot {action} job {job.uuid} ({job.name}): it is not on board"
                               f" '{self.name}'")
        if status == "notowner" and not value:
            raise exc.NotFound(f"Cannot {action} job {job.uuid} ({job.name}) as '{who}': it is"
                               f" not claimed")
        if status == "notowner":
            raise exc.JobFailure(f"Cannot {action} job {job.uuid} ({job.name}) as '{who}': it is"
                                 f" claimed by '{value}'")

    def post(self, name: str, book: models.LogBook | None = None,
             details: dict[str, Any] | None = None,
             priority: base.JobPriority | str = base.JobPriority.NORMAL) -> base.Job:
        """Post a job (details must be JSON-ready); every follower is woken."""
        posting, encoded = new_posting(name, book, details, priority)
        self._run("POST", posting["uuid"], "", encoded.decode("utf-8"))
        with self._lock:
            # Listed at once by this board, before its own announcement comes back.
            self._cache.setdefault(posting["uuid"], posting)
        self._replicated(f"post job {posting['uuid']} ({name})")
        job = self._job(posting)
        if book is not None:
            job._book = book
        return job

    @base.check_who
    def claim(self, job: base.Job, who: str, expiry: float | None = None) -> int:
        """Claim ``job`` for ``expiry`` or ``claim_ttl`` seconds (see :meth:`JobBoard.claim`).

        The fencing token returned is one board-wide counter's next value, and at least the
        Redis server's clock in microseconds (:func:`~flowengine.jobs.records.fencing_token`).
        """
        ttl_ms = max(1, int(self._lease_seconds(expiry) * 1000))
        status, value = self._run("CLAIM", job.uuid, who, ttl_ms, self.options.max_attempts,
                                  base.utcnow().isoformat())
        if status == "missing":
            self._refused(status, value, job, who, "claim")
        if status == "owned":
            raise exc.UnclaimableJob(f"Job {job.uuid} ({job.name}) is already claimed by"
                                     f" '{value}'")
        if status == "trashed":
            raise exc.UnclaimableJob(f"Job {job.uuid} ({job.name}) was moved to the trash: it"
                                     f" was abandoned or orphaned {value} times")
        return int(value)

    @base.check_who
    def keep_alive(self, job: base.Job, who: str) -> None:
        """Renew ``who``'s claim; raises :class:`~..base.ClaimLost` if it no longer holds it."""
        status, _ = self._run("KEEP_ALIVE", job.uuid, who, int(self.options.claim_ttl * 1000))
        if status != "renewed":
            raise base.ClaimLost(f"'{who}' lost its claim on job {job.uuid} ({job.name})",
                                 job.uuid, who)

    @base.check_who
    def consume(self, job: base.Job, who: str) -> None:
        """Remove a finished job (see :meth:`JobBoard.consume`)."""
        self._refused(*self._run("CONSUME", job.uuid, who), job, who, "consume")

    @base.check_who
    def abandon(self, job: base.Job, who: str, counted: bool = True) -> None:
        """Release ``who``'s claim (see :meth:`JobBoard.abandon`)."""
        status, value = self._run("ABANDON", job.uuid, who, "1" if counted else "0",
                                  self.options.max_attempts, base.utcnow().isoformat())
        self._refused(status, value, job, who, "abandon")

    @base.check_who
    def trash(self, job: base.Job, who: str, reason: str = "", counted: bool = True) -> None:
        """Move a claimed job to the trash (see :meth:`JobBoard.trash`)."""
        status, value = self._run("TRASH", job.uuid, who, reason or f"trashed by {who}",
                                  base.utcnow().isoformat(), "1" if counted else "0")
        self._refused(status, value, job, who, "trash")

    def iter_trash(self) -> list[base.TrashedJob]:
        """The trashed jobs, oldest first."""
        with self._talking("list its trash") as client, \
                client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self._keys[2])
            pipe.hgetall(self._keys[3])
            postings, infos = pipe.execute()
        trashed = []
        for key, raw in postings.items():
            try:
                info = json.loads(_text(infos.get(key, b"{}")))
                found = records.trashed_job(records.read_posting(raw), info)
            except (records.PostingError, ValueError):
                found = None
            if found is None:
                self._damage.found(f"trash:{_text(key)}", "a trashed job that is not a posting")
                continue
            trashed.append(found)
        return sorted(trashed, key=lambda t: t.trashed_on)

    def repost(self, job_uuid: str) -> base.Job:
        """Put a trashed job back on the board (see :meth:`JobBoard.repost`)."""
        status, posting = self._run("REPOST", job_uuid, "")
        if status == "missing":
            raise exc.NotFound(f"No trashed job {job_uuid} on board '{self.name}'")
        try:
            return self._job(records.read_posting(posting))
        except records.PostingError as err:
            raise exc.JobFailure(f"Re-posted trashed job {job_uuid} on board '{self.name}', but"
                                 f" it is a damaged posting ({err}): discard it") from err

    def discard(self, job_uuid: str) -> None:
        """Delete a trashed job (see :meth:`JobBoard.discard`)."""
        if self._run("DISCARD", job_uuid, "")[0] == "missing":
            raise exc.NotFound(f"No trashed job {job_uuid} on board '{self.name}'")

    # ---- entities ------------------------------------------------------------------------------

    def _entity_keys(self) -> list[str]:
        return [f"{self._ns}:entities", f"{self._ns}:entity-expiries"]

    def register_entity(self, entity: Entity) -> None:
        """Record ``entity`` for ``claim_ttl`` seconds of the server's clock (again: refresh)."""
        with self._talking(f"register {entity.name}"):
            self._scripts["REGISTER"](keys=self._entity_keys(), args=[
                f"{entity.kind}:{entity.name}", json.dumps(entity.to_dict()),
                int(self.options.claim_ttl * 1000)])

    def unregister_entity(self, entity: Entity) -> None:
        """Forget ``entity`` now."""
        member = f"{entity.kind}:{entity.name}"
        entities, expiries = self._entity_keys()
        with self._talking(f"unregister {entity.name}") as client, \
                client.pipeline(transaction=True) as pipe:
            pipe.hdel(entities, member)
            pipe.zrem(expiries, member)
            pipe.execute()

    def iter_entities(self, kind: str | None = None) -> list[Entity]:
        """The live entities (of ``kind``), sorted by name."""
        with self._talking("list its entities"):
            flat = self._scripts["LIVE_ENTITIES"](keys=self._entity_keys())
        found = [Entity.from_dict(json.loads(_text(value))) for value in flat[1::2]]
        return sorted((e for e in found if kind is None or e.kind == kind),
                      key=lambda e: (e.kind, e.name))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


