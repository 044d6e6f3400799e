"""How a job ended, kept in its logbook, where ``flowengine jobs list`` and the dashboard read it.

A board forgets a job once it is consumed or trashed; its logbook stays in persistence (a
conductor deletes one only when asked to, and only when its flow succeeded). The conductor that
finished a job records in the logbook's ``meta["job"]`` how it ended:

=============  =================================================================================
``SUCCESS``    the flow ended SUCCESS
``REVERTED``   the flow failed and was reverted (the reason names the atom that failed)
``FAILED``     the flow failed and could not be reverted, or it could not start at all
               (missing inputs, say)
``TRASHED``    the job was moved to the trash (the reason says why)
=============  =================================================================================

:func:`~flowengine.jobs.posting.post_flow` records the board a job was posted to in the same
place (``meta["job"]["board"]``, the board's :attr:`~flowengine.jobs.base.JobBoard.identity`),
so that the endings, and the flows whose job was lost (:mod:`flowengine.jobs.orphans`), are
found per board.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs.records import JobPriority, parse_date, utcnow

if TYPE_CHECKING:
    from flowengine.jobs.base import Job, JobBoard
    from flowengine.persistence import base as persistence_base
    from flowengine.persistence import models

__all__ = ["FAILED", "META_KEY", "OUTCOMES", "REVERTED", "SUCCESS", "TRASHED", "Ending",
           "board_of", "ending_of", "failure_reason", "find_endings", "mark_posted",
           "outcome_of", "record"]

#: The logbook metadata key holding the job's board and ending.
META_KEY = "job"
SUCCESS, REVERTED, FAILED, TRASHED = "SUCCESS", "REVERTED", "FAILED", "TRASHED"
#: Every outcome, best first.
OUTCOMES = (SUCCESS, REVERTED, FAILED, TRASHED)


@dataclasses.dataclass(frozen=True)
class Ending:
    """How one job ended.

    Attributes:
        job_uuid: The job.
        job_name: Its name.
        book_uuid: Its logbook (kept unless it succeeded and the conductor deletes those).
        outcome: One of :data:`OUTCOMES`.
        reason: Why it did not succeed ("" when it did); secrets masked.
        conductor: The conductor that finished it.
        ended_at: When (UTC).
        flow_state: Its flow's stored state then (None when unknown).
    """

    job_uuid: str
    job_name: str
    book_uuid: str
    outcome: str
    reason: str
    conductor: str
    ended_at: datetime.datetime
    flow_state: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form kept in the logbook (and printed by ``jobs list --json``)."""
        return {"uuid": self.job_uuid, "name": self.job_name, "book": self.book_uuid,
                "outcome": self.outcome, "reason": self.reason, "conductor": self.conductor,
                "ended_at": self.ended_at.isoformat(), "flow_state": self.flow_state}


def outcome_of(flow_state: str | None) -> str:
    """The outcome of a consumed job whose flow is stored in ``flow_state``."""
    if flow_state == states.SUCCESS:
        return SUCCESS
    if flow_state == states.REVERTED:
        return REVERTED
    return FAILED


def failure_reason(flow_detail: models.FlowDetail) -> str:
    """The first stored failure of a flow's atoms, as ``atom: Type: message`` ("" if none)."""
    for atom in flow_detail:
        for failure in (atom.failure, atom.revert_failure):
            if failure is not None:
                kind = failure.exc_type_names[0] if failure.exc_type_names else "Failure"
                return f"{atom.name} failed: {kind}: {failure.exception_str}"
    return ""


def mark_posted(book: models.LogBook, board: JobBoard, details: dict[str, Any],
                priority: JobPriority) -> None:
    """Record in ``book`` (before it is saved) that its job, with ``details`` and
    ``priority``, goes to ``board``: what finds it again if the board loses it."""
    found = book.meta.get(META_KEY)
    book.meta[META_KEY] = {**(found if isinstance(found, dict) else {}),
                           "board": board.identity, "details": details,
                           "priority": priority.value}


def board_of(book: models.LogBook) -> str | None:
    """The identity of the board ``book``'s job was posted to (None: not posted that way)."""
    found = book.meta.get(META_KEY) if isinstance(book.meta, dict) else None
    board = found.get("board") if isinstance(found, dict) else None
    return board if isinstance(board, str) else None


def ending_of(book: models.LogBook) -> Ending | None:
    """How ``book``'s job ended (None: it has not, or no conductor recorded it)."""
    found = book.meta.get(META_KEY) if isinstance(book.meta, dict) else None
    data = found.get("ending") if isinstance(found, dict) else None
    if not isinstance(data, dict) or data.get("outcome") not in OUTCOMES:
        return None
    try:
        ended_at = parse_date(data.get("ended_at")) or utcnow()
    except ValueError:
        ended_at = utcnow()
    return Ending(job_uuid=str(data.get("uuid") or ""), job_name=str(data.get("name") or ""),
                  book_uuid=book.uuid, outcome=str(data["outcome"]),
                  reason=str(data.get("reason") or ""),
                  conductor=str(data.get("conductor") or ""), ended_at=ended_at,
                  flow_state=data.get("flow_state"))


def record(persistence: persistence_base.Backend, job: Job, ending: Ending) -> None:
    """Keep ``ending`` in ``job``'s logbook (its flow details are left as they are).

    Raises:
        flowengine.exceptions.NotFound: If the logbook is gone.
        flowengine.exceptions.StorageFailure: If it cannot be saved.
    """
    if job.book_uuid is None:
        raise exc.NotFound(f"Job {job.uuid} ({job.name}) has no logbook to record its ending in")
    with contextlib.closing(persistence.get_connection()) as conn:
        book = conn.get_logbook(job.book_uuid, lazy=True)
        found = book.meta.get(META_KEY)
        book.meta = {**book.meta, META_KEY: {**(found if isinstance(found, dict) else {}),
                                             "ending": ending.to_dict()}}
        conn.save_logbook(book)


def find_endings(persistence: persistence_base.Backend, board: JobBoard | None = None,
                 limit: int | None = None) -> list[Ending]:
    """The recorded endings (of jobs posted to ``board``, if given), most recent first.

    A logbook without a board mark (a job posted by hand, TaskFlow's way) counts for every
    board.
    """
    with contextlib.closing(persistence.get_connection()) as conn:
        books: Iterable[models.LogBook] = list(conn.get_logbooks(lazy=True))
    found = [ending for book in books if (ending := ending_of(book)) is not None
             and (board is None or board_of(book) in (None, board.identity))]
    found.sort(key=lambda e: e.ended_at, reverse=True)
    return found if limit is None else found[:limit]
