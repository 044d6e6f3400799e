"""The jobs of a chaos session on a jobboard: posted to keep the conductors busy, then counted.

:class:`Poster` posts instances of the flow as jobs (:func:`flowengine.jobs.posting.post_flow`,
each in a logbook named ``<prefix>-<n>``, instance ``n`` with ``chaos_instance=n`` in its
store), so that ``concurrency`` of them are on the board at any time, until it is stopped.
Waiting for a job to leave the board is pushed by the board, never a polling loop.

:func:`census` tells, once the session is over, where every posted job is: still on the board
(claimed by whom), in the trash (and why), or gone with the ending its conductor recorded in
its logbook (:mod:`flowengine.jobs.endings`). :mod:`.certify` judges it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowengine import exceptions as exc
from flowengine.jobs import endings
from flowengine.jobs.base import JobBoard
from flowengine.jobs.posting import post_flow
from flowengine.persistence import base as persistence_base

#: Longest wait for the board before looking again (a safety net: waiting is pushed).
LOOK_AGAIN = 5.0


def own_location(board_uri: str, location: str) -> dict[str, str]:
    """The board conf keys that keep a session's jobs under ``location``, apart from the jobs
    of the board's production conductors (which would claim them otherwise): a Redis
    ``namespace``; a ZooKeeper ``path`` of ``/<location>/jobs`` (its trash and registrations
    sit beside it); an etcd ``path``. A board of another kind is used as given (no keys).
    """
    scheme = urllib.parse.urlsplit(board_uri).scheme.lower()
    if scheme in ("redis", "rediss"):
        return {"namespace": location}
    if scheme in ("zookeeper", "zk"):
        return {"path": f"/{location}/jobs"}
    if scheme == "etcd":
        return {"path": location}
    return {}


@dataclasses.dataclass(frozen=True)
class Posted:
    """A job the session posted."""

    uuid: str
    name: str
    book: str
    instance: int


@dataclasses.dataclass(frozen=True)
class JobState:
    """Where one posted job ended up (see :func:`census`).

    Attributes:
        posted: The job.
        on_board: It is still on the board.
        owner: Who holds a claim on it (on the board only; None: nobody).
        trashed: Why it is in the trash (None: it is not).
        ending: The ending its conductor recorded (``SUCCESS``, ``REVERTED``, ``FAILED``,
            ``TRASHED``; None: none).
        reason: The ending's reason.
        flow_state: Its flow's stored state (None: its logbook is gone).
    """

    posted: Posted
    on_board: bool = False
    owner: str | None = None
    trashed: str | None = None
    ending: str | None = None
    reason: str = ""
    flow_state: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As JSON data."""
        return {**dataclasses.asdict(self.posted), "on_board": self.on_board,
                "owner": self.owner, "trashed": self.trashed, "ending": self.ending,
                "reason": self.reason, "flow_state": self.flow_state}


class Poster:
    """Keeps ``concurrency`` jobs of the flow on the board until :meth:`stop`.

    Args:
        board: The session's board (connected).
        persistence: Where the jobs' logbooks go (the conductors' store).
        factory: The flow factory (conductors import it by name).
        args, kwargs: Its arguments.
        store: The flow's inputs (each job adds ``chaos_instance``).
        prefix: The jobs' and logbooks' names start with ``<prefix>-``.
        concurrency: Jobs kept on the board.
        say: Told about a job that could not be posted.
    """

    def __init__(self, board: JobBoard, persistence: persistence_base.Backend,
                 factory: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                 store: Mapping[str, Any], prefix: str, concurrency: int,
                 say: Callable[[str], None]) -> None:
        self._board, self._persistence = board, persistence
        self._factory, self._args, self._kwargs = factory, list(args), dict(kwargs)
        self._store, self._prefix, self._concurrency = dict(store), prefix, concurrency
        self._say = say
        self.posted: list[Posted] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def post(self) -> Posted:
        """Post the next instance."""
        instance = len(self.posted) + 1
        name = f"{self._prefix}-{instance}"
        job = post_flow(self._board, self._persistence, self._factory, self._args,
                        self._kwargs, store={**self._store, "chaos_instance": instance},
                        name=name)
        assert job.book_uuid is not None  # post_flow always saves a logbook
        posted = Posted(job.uuid, name, job.book_uuid, instance)
        self.posted.append(posted)
        return posted

    def start(self) -> None:
        """Fill the board, then keep it filled on a thread of its own."""
        for _ in range(self._concurrency):
            self.post()
        self._thread = threading.Thread(target=self._keep, daemon=True, name="chaos-poster")
        self._thread.start()

    def _keep(self) -> None:
        board = self._board
        while not self._stopping.is_set():
            try:
                if not board.wait_until(lambda: self._stopping.is_set()
                                        or board.job_count < self._concurrency, LOOK_AGAIN):
                    continue
                if self._stopping.is_set():
                    return
                for _ in range(self._concurrency - board.job_count):
                    self.post()
            except exc.TaskFlowException as err:  # the board's server is shared, not faulted
                self._say(f"chaos: posting a job failed: {err}")
                self._stopping.wait(1.0)

    def stop(self) -> None:
        """Post no more."""
        self._stopping.set()
        self._board.wake_waiters()
        if self._thread is not None:
            self._thread.join(LOOK_AGAIN * 2)

    def wait_drained(self, timeout: float) -> bool:
        """Block until the board holds no job; False if ``timeout`` passed first."""
        return self._board.wait_until(lambda: self._board.job_count == 0, timeout)


def census(board: JobBoard, persistence: persistence_base.Backend,
           posted: Sequence[Posted]) -> list[JobState]:
    """Where each of ``posted`` is now (see the module docstring)."""
    owners: dict[str, str | None] = {}
    for on_board in board.iterjobs(ensure_fresh=True):
        try:
            owners[on_board.uuid] = board.find_owner(on_board)
        except exc.NotFound:  # consumed while we looked
            continue
    trash = {t.uuid: t.reason for t in board.iter_trash()}
    found = []
    with contextlib.closing(persistence.get_connection()) as conn:
        for job in posted:
            try:
                book = conn.get_logbook(job.book)
            except exc.NotFound:
                book = None
            ending = endings.ending_of(book) if book is not None else None
            flows = [str(detail.state) for detail in book] if book is not None else []
            found.append(JobState(job, on_board=job.uuid in owners, owner=owners.get(job.uuid),
                                  trashed=trash.get(job.uuid),
                                  ending=ending.outcome if ending is not None else None,
                                  reason=ending.reason if ending is not None else "",
                                  flow_state=flows[0] if len(flows) == 1 else None))
    return found
