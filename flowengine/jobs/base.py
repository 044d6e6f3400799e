"""Jobs and jobboards: TaskFlow's API, with claims that are leases.

A *job* names a logbook (its flows) and carries free-form ``details``; it is *posted* on a
*jobboard* that lives on a coordination service (Redis, ZooKeeper, etcd). Conductors *claim*
jobs, run their flows and then *consume* them (done), *abandon* them (let another conductor
resume them) or *trash* them (set aside for an operator).

Names, arguments and semantics are TaskFlow's. What every flowengine backend adds and must
guarantee (the board behaviour suite in ``tests/jobs/`` checks each one):

* **A claim is a lease** held by the service (Redis key expiry, ZooKeeper ephemeral node, etcd
  lease), ``claim_ttl`` seconds long (30 by default). :meth:`JobBoard.keep_alive` renews it;
  when its holder stops renewing (killed, frozen, partitioned) the service ends the claim by
  itself and the job is unclaimed again, without any other party deciding it.
* **Every claim has a fencing token** (what :meth:`JobBoard.claim` returns), greater than
  every earlier claim's of the job; the store refuses a write made under an older claim than
  one it has seen (:mod:`flowengine.persistence.fencing`). The attempt count cannot be it: an
  uncounted abandon takes an attempt back, and a re-post starts it again from 0.
* **Attempts are counted.** Every successful claim is one attempt (:attr:`Job.attempts`). A job
  whose ``max_attempts`` claims (3 by default; 0 means no limit) all ended in an abandon or an
  expired claim is moved to the trash instead of being offered again; the trash keeps the reason
  and can be listed (:meth:`JobBoard.iter_trash`) and re-posted (:meth:`JobBoard.repost`).
* **Waiting is pushed.** :meth:`JobBoard.wait` and :meth:`Job.wait` block on the service's own
  notifications (pub/sub, watches); a backend calls :meth:`JobBoard._notify_change` whenever it
  learns that any job changed, and answers :meth:`JobBoard._next_wakeup` with when a lease it
  knows of ends, if the service does not announce that itself. Neither method polls.
* **A damaged posting stops nothing.** A value in the board's job folder that is not a
  posting (:func:`~flowengine.jobs.records.check_posting`) is skipped, logged once, moved to the
  trash when nobody holds a claim on it, and listed by :meth:`JobBoard.iter_damaged`.
* **Entities stay visible while alive.** :meth:`JobBoard.register_entity` records a conductor
  (or any :class:`~flowengine.types.entity.Entity`) for ``claim_ttl`` seconds; registering again
  refreshes it, and :meth:`JobBoard.iter_entities` lists the live ones.

A job whose record is gone (consumed or trashed) reads as :data:`~flowengine.states.COMPLETE`,
as in TaskFlow.
"""

from __future__ import annotations

import abc
import contextlib
import datetime
import functools
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs.damage import DamageLog
from flowengine.jobs.records import (
    DEFAULT_CLAIM_TTL,
    DEFAULT_MAX_ATTEMPTS,
    BoardOptions,
    ClaimLost,
    DamagedPosting,
    JobPriority,
    TrashedJob,
    format_posting,
    parse_date,
    utcnow,
)
from flowengine.types import notifier

if TYPE_CHECKING:
    from flowengine.persistence import base as persistence_base
    from flowengine.persistence import models
    from flowengine.types.entity import Entity

__all__ = [
    "DEFAULT_CLAIM_TTL", "DEFAULT_MAX_ATTEMPTS", "POSTED", "REMOVAL",
    "BoardOptions", "ClaimLost", "DamagedPosting", "Job", "JobBoard", "JobBoardIterator",
    "JobFailure", "JobPriority",
    "NotFound", "NotifyingJobBoard", "TrashedJob", "UnclaimableJob", "check_who", "format_posting",
    "utcnow",
]

#: TaskFlow's exceptions, importable from here as well.
NotFound = exc.NotFound
UnclaimableJob = exc.UnclaimableJob
JobFailure = exc.JobFailure

POSTED = "POSTED"  # a job was posted
REMOVAL = "REMOVAL"  # a job was removed (consumed or trashed)


class Job(metaclass=abc.ABCMeta):
    """A named unit of work posted on a board: a logbook to run and some details.

    Backends subclass it and read :attr:`state` and :attr:`attempts` from the service.

    Args:
        board: The board it was posted on or read from.
        name: Its (not unique) name.
        uuid: Its uuid (a new one if omitted).
        details: Free-form JSON-ready details (the conductor reads ``store`` from them).
        backend: The persistence backend :attr:`book` is loaded from.
        book: The logbook, if already loaded.
        book_data: ``{"name", "uuid"}`` of the logbook when it is not loaded.
        priority: Its priority.
        created_on: When it was first posted.
        last_modified: When its posting last changed.
    """

    def __init__(self, board: JobBoard, name: str, uuid: str | None = None,
                 details: dict[str, Any] | None = None,
                 backend: persistence_base.Backend | None = None,
                 book: models.LogBook | None = None, book_data: dict[str, Any] | None = None,
                 priority: JobPriority = JobPriority.NORMAL,
                 created_on: datetime.datetime | None = None,
                 last_modified: datetime.datetime | None = None) -> None:
        self._board = board
        self._name = name
        self._uuid = uuid or str(uuidlib.uuid4())
        self._details = details or {}
        self._backend = backend
        self._book = book
        self._book_data = book_data or {}
        self._priority = priority
        self._created_on = created_on
        self._last_modified = last_modified

    @classmethod
    def from_posting(cls: type[_J], board: JobBoard, posting: dict[str, Any],
                     backend: persistence_base.Backend | None = None, **kwargs: Any) -> _J:
        """The job a :func:`format_posting` record describes."""
        return cls(board, posting["name"], uuid=posting["uuid"],
                   details=posting.get("details") or {}, backend=backend,
                   book_data=posting.get("book") or {},
                   priority=JobPriority.convert(posting.get("priority", "NORMAL")),
                   created_on=parse_date(posting.get("created_on")),
                   last_modified=parse_date(posting.get("last_modified")), **kwargs)

    @property
    @abc.abstractmethod
    def state(self) -> str:
        """UNCLAIMED, CLAIMED or COMPLETE (gone: consumed or trashed), read from the service."""

    @property
    @abc.abstractmethod
    def attempts(self) -> int:
        """How many times it has been claimed, read from the service (0 once gone)."""

    @property
    def board(self) -> JobBoard:
        """The board it was posted on or read from."""
        return self._board

    @property
    def priority(self) -> JobPriority:
        """Its :class:`JobPriority`."""
        return self._priority

    @property
    def created_on(self) -> datetime.datetime | None:
        """When it was posted (UTC)."""
        return self._created_on

    @property
    def last_modified(self) -> datetime.datetime | None:
        """When its posting last changed (UTC)."""
        return self._last_modified

    @property
    def uuid(self) -> str:
        """Its uuid."""
        return self._uuid

    @property
    def name(self) -> str:
        """Its name (not unique)."""
        return self._name

    @property
    def details(self) -> dict[str, Any]:
        """Its details, as posted (see :func:`flowengine.jobs.masking.masked` to show them)."""
        return self._details

    @property
    def book(self) -> models.LogBook | None:
        """Its logbook, loaded from the persistence backend on first use (None if it has none)."""
        if self._book is None and self._backend is not None and self.book_uuid is not None:
            with contextlib.closing(self._backend.get_connection()) as conn:
                self._book = conn.get_logbook(self.book_uuid)
        return self._book

    @property
    def book_uuid(self) -> str | None:
        """Its logbook's uuid."""
        return self._book.uuid if self._book is not None else self._book_data.get("uuid")

    @property
    def book_name(self) -> str | None:
        """Its logbook's name."""
        return self._book.name if self._book is not None else self._book_data.get("name")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until it is COMPLETE (consumed or trashed); False if ``timeout`` passes first.

        Woken by the board's notifications, never by polling.
        """
        return self._board.wait_until(lambda: self.state == states.COMPLETE, timeout)

    def __str__(self) -> str:
        from flowengine.jobs.masking import masked

        return (f"{type(self).__name__}: {self.name} (priority={self.priority}, uuid={self.uuid},"
                f" details={masked(self.details)})")


_J = TypeVar("_J", bound=Job)


class JobBoardIterator(Iterator[Job]):
    """Iterates over a board's jobs, skipping those that vanished or changed state meanwhile.

    Args:
        board: The board.
        fetch: Returns the jobs to offer (most urgent first), each alone or as ``(job, state)``
            when the backend read its state along with the listing (saving a read per job).
        only_unclaimed: Offer only jobs that are UNCLAIMED when reached.
        ensure_fresh: Passed to ``fetch``: read the service rather than the board's cache.
    """

    def __init__(self, board: JobBoard,
                 fetch: Callable[[bool], Iterable[Job | tuple[Job, str]]],
                 only_unclaimed: bool = False, ensure_fresh: bool = False) -> None:
        self._board = board
        self._fetch = fetch
        self._jobs: list[Job | tuple[Job, str]] | None = None
        self.only_unclaimed = only_unclaimed
        self.ensure_fresh = ensure_fresh

    @property
    def board(self) -> JobBoard:
        """The board it iterates over."""
        return self._board

    def __iter__(self) -> JobBoardIterator:
        return self

    def __next__(self) -> Job:
        if self._jobs is None:
            self._jobs = list(self._fetch(self.ensure_fresh))
            self._jobs.reverse()
        allowed = (states.UNCLAIMED,) if self.only_unclaimed else (states.UNCLAIMED,
                                                                   states.CLAIMED)
        while self._jobs:
            item = self._jobs.pop()
            job, state = item if isinstance(item, tuple) else (item, None)
            if (state if state is not None else job.state) in allowed:
                return job
        raise StopIteration


class JobBoard(metaclass=abc.ABCMeta):
    """A place where jobs are posted, claimed, renewed, completed, abandoned and trashed.

    Args:
        name: The board's name (for logs).
        conf: Backend configuration; see :class:`BoardOptions` for the keys every backend reads.
        persistence: The persistence backend jobs' logbooks are saved in and loaded from.
    """

    def __init__(self, name: str, conf: dict[str, Any],
                 persistence: persistence_base.Backend | None = None) -> None:
        self._name = name
        self._persistence = persistence
        self._conf = dict(conf)
        self.options = BoardOptions.from_conf(self._conf)
        self._changes = threading.Condition()
        self._generation = 0
        self._damage = DamageLog(name)

    @property
    def name(self) -> str:
        """The board's name."""
        return self._name

    @property
    def identity(self) -> str:
        """Which board this is, the same in every process using it (its kind and where its jobs
        live: a Redis namespace, a ZooKeeper or etcd path), unlike :attr:`name`."""
        return f"{type(self).__name__}:{self._location()}"

    def _location(self) -> str:
        """Where the board's jobs live, for :attr:`identity` (backends say it exactly)."""
        return str(self._conf.get("namespace") or self._conf.get("path") or "")

    # ---- TaskFlow's API ------------------------------------------------------------------------

    @abc.abstractmethod
    def iterjobs(self, only_unclaimed: bool = False, ensure_fresh: bool = False) -> Iterator[Job]:
        """Jobs on the board, most urgent first, then oldest first.

        Args:
            only_unclaimed: Only jobs nobody holds a claim on.
            ensure_fresh: Read the service now; otherwise a board may answer from a cache that its
                notifications keep current (it may lag the service by a notification).
        """

    def wait(self, timeout: float | None = None) -> Iterator[Job]:
        """Block until some job is unclaimed; return an iterator over the unclaimed jobs.

        Woken by the service's notifications (a post, an abandon, a claim that ended), never by
        polling.

        Raises:
            flowengine.exceptions.NotFound: If ``timeout`` seconds pass with no unclaimed job.
        """
        found: list[Job] = []

        def unclaimed() -> bool:
            found[:] = list(self.iterjobs(only_unclaimed=True, ensure_fresh=True))
            return bool(found)

        if not self.wait_until(unclaimed, timeout):
            raise NotFound(f"No unclaimed job appeared on board '{self.name}' within {timeout}s")
        return iter(found)

    @property
    def job_count(self) -> int:
        """How many jobs the board holds (any state)."""
        return sum(1 for _ in self.iterjobs())

    @abc.abstractmethod
    def find_owner(self, job: Job) -> str | None:
        """Who holds a claim on ``job`` (None if nobody).

        Raises:
            flowengine.exceptions.NotFound: If the job is gone.
        """

    @abc.abstractmethod
    def post(self, name: str, book: models.LogBook | None = None,
             details: dict[str, Any] | None = None,
             priority: JobPriority | str = JobPriority.NORMAL) -> Job:
        """Post a new, unclaimed job and wake every waiter. Returns it."""

    @abc.abstractmethod
    def claim(self, job: Job, who: str, expiry: float | None = None) -> int:
        """Take a lease on ``job`` for ``who`` and count one attempt.

        A job that already had ``max_attempts`` claims is moved to the trash instead (reason:
        abandoned or orphaned N times) and :class:`UnclaimableJob` raised.

        Returns the claim's *fencing token* (a flowengine addition; TaskFlow's boards return
        None): a number greater than that of every earlier claim of the job, whether those
        ended in a consume, an abandon, counted or not, an expiry or a takeover, and never
        given twice (:func:`~flowengine.jobs.records.fencing_token`). A conductor writes its
        job's progress under it, and the store refuses writes made under a smaller one than
        it has seen for the flow (:mod:`flowengine.persistence.fencing`).

        Args:
            job: The job.
            who: The claimant.
            expiry: Seconds the lease lasts (TaskFlow's argument); None means ``claim_ttl``.
                :meth:`keep_alive` renews it for ``claim_ttl`` on Redis, for as long again on
                the other backends.

        Raises:
            ValueError: If ``expiry`` is not a positive number.
            flowengine.exceptions.NotFound: If the job is gone.
            flowengine.exceptions.UnclaimableJob: If anyone, ``who`` included, holds a claim on
                it, or it was just trashed.
        """

    @abc.abstractmethod
    def keep_alive(self, job: Job, who: str) -> None:
        """Renew ``who``'s claim on ``job`` for another ``claim_ttl`` seconds.

        Raises:
            ClaimLost: If ``who`` no longer holds the claim (expired, or the job is gone).
        """

    @abc.abstractmethod
    def consume(self, job: Job, who: str) -> None:
        """Remove a job ``who`` holds a claim on: its work is done.

        Raises:
            flowengine.exceptions.NotFound: If the job is gone or nobody holds a claim on it.
            flowengine.exceptions.JobFailure: If someone else holds the claim.
        """

    @abc.abstractmethod
    def abandon(self, job: Job, who: str, counted: bool = True) -> None:
        """Release ``who``'s claim so another owner can resume the job.

        Args:
            job: The job.
            who: Its claim holder.
            counted: Whether the attempt counts toward ``max_attempts`` (False when a stopping
                conductor hands back a job it did not fail on). A counted abandon of a job that
                reached ``max_attempts`` moves it to the trash.

        Raises:
            flowengine.exceptions.NotFound: If the job is gone or nobody holds a claim on it.
            flowengine.exceptions.JobFailure: If someone else holds the claim.
        """

    @abc.abstractmethod
    def trash(self, job: Job, who: str, reason: str = "", counted: bool = True) -> None:
        """Move a job ``who`` holds a claim on to the trash (with ``reason``).

        ``counted=False`` (a flowengine addition): the claim was taken only to trash the job
        (an operator's ``flowengine jobs trash``), so the trash records the attempts before it.

        Raises:
            flowengine.exceptions.NotFound: If the job is gone or nobody holds a claim on it.
            flowengine.exceptions.JobFailure: If someone else holds the claim.
        """

    @abc.abstractmethod
    def register_entity(self, entity: Entity) -> None:
        """Record ``entity`` as alive for ``claim_ttl`` seconds (again: refresh it)."""

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """Whether the board is connected to its service."""

    @abc.abstractmethod
    def connect(self) -> None:
        """Connect to the service and start following its notifications."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop following notifications and disconnect (claims it holds then expire)."""

    # ---- flowengine's additions ----------------------------------------------------------------

    @abc.abstractmethod
    def unregister_entity(self, entity: Entity) -> None:
        """Forget ``entity`` now (a conductor stopping cleanly)."""

    @abc.abstractmethod
    def iter_entities(self, kind: str | None = None) -> list[Entity]:
        """The registered entities that are alive, of ``kind`` if given, sorted by name."""

    @abc.abstractmethod
    def iter_trash(self) -> list[TrashedJob]:
        """The trashed jobs, oldest first."""

    def iter_damaged(self) -> list[DamagedPosting]:
        """The damaged postings this board found in its job folder, by key: values that are not
        job postings, which it skipped (and moved to the trash when that was safe)."""
        return self._damage.listing()

    @abc.abstractmethod
    def repost(self, job_uuid: str) -> Job:
        """Move a trashed job back to the board, unclaimed, with no attempts counted.

        Raises:
            flowengine.exceptions.NotFound: If no trashed job has that uuid.
        """

    @abc.abstractmethod
    def discard(self, job_uuid: str) -> None:
        """Delete a trashed job for good.

        Raises:
            flowengine.exceptions.NotFound: If no trashed job has that uuid.
        """

    def __enter__(self) -> JobBoard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- for backends: pushed waiting ----------------------------------------------------------

    def _notify_change(self) -> None:
        """Wake every waiter: something on the board changed (call from notification threads)."""
        with self._changes:
            self._generation += 1
            self._changes.notify_all()

    def _next_wakeup(self) -> float | None:
        """Seconds until a lease the service will not announce ends (None: none known)."""
        return None

    def _lease_seconds(self, expiry: float | None) -> float:
        """How long a claim taken with ``expiry`` lasts (:meth:`claim`)."""
        if expiry is None:
            return self.options.claim_ttl
        if isinstance(expiry, bool) or not isinstance(expiry, (int, float)) or not expiry > 0:
            raise ValueError(f"Claim expiry on board '{self.name}' must be a number of seconds"
                             f" > 0, not {expiry!r}")
        return float(expiry)

    def wake_waiters(self) -> None:
        """Make every :meth:`wait_until` look at its condition again (a conductor stopping)."""
        self._notify_change()

    def wait_until(self, condition: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``condition()`` is true, re-checking it whenever the board changes.

        Returns False if ``timeout`` seconds pass first. ``condition`` may read the service; it
        is never called in a loop without a change (or a lease end) in between.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._changes:
                seen = self._generation
            if condition():
                return True
            with self._changes:
                if self._generation != seen:
                    continue  # changed while we looked: look again before sleeping
                waits = [w for w in (self._next_wakeup(),
                                     None if deadline is None else deadline - time.monotonic())
                         if w is not None]
                if deadline is not None and deadline - time.monotonic() <= 0:
                    return False
                self._changes.wait(max(0.0, min(waits)) if waits else None)


class NotifyingJobBoard(JobBoard):
    """A board whose :attr:`notifier` announces :data:`POSTED` and :data:`REMOVAL` events.

    Listeners are called as ``callback(event, details={"job": job})``.
    """

    def __init__(self, name: str, conf: dict[str, Any],
                 persistence: persistence_base.Backend | None = None) -> None:
        super().__init__(name, conf, persistence)
        self.notifier = notifier.Notifier()


def check_who(meth: Callable[..., _R]) -> Callable[..., _R]:
    """Decorate a board method taking ``(job, who)``: ``who`` must be a non-empty string."""

    @functools.wraps(meth)
    def wrapper(self: Any, job: Any, who: Any, *args: Any, **kwargs: Any) -> _R:
        if not isinstance(who, str):
            raise TypeError(f"Job applicant must be a string, not {type(who).__name__}")
        if not who:
            raise ValueError("Job applicant must be non-empty")
        return meth(self, job, who, *args, **kwargs)

    return wrapper


_R = TypeVar("_R")
