"""Orphaned flows: stored unfinished, posted as a job that the board no longer has.

A board can lose a job without anyone finishing it: a Redis restarted without its data, an
operator deleting a key, a conductor cut off while its claim lapsed and the job vanished. Its
flow then stays stored RUNNING (or PENDING, SUSPENDED...) for ever, with nothing pointing at
it. A flow is *orphaned* on a board when:

* its logbook was posted to that board (:func:`flowengine.jobs.posting.post_flow` records it,
  with the job's details and priority: see :mod:`flowengine.jobs.endings`), and no conductor
  recorded how that job ended;
* its state is unfinished (not SUCCESS, REVERTED or FAILURE);
* no job on the board, nor in its trash, points at its logbook;
* no live conductor on the board holds it: a conductor lists the logbooks of the jobs it runs
  in its registration (``metadata["books"]``), refreshed every third of ``claim_ttl``.

:func:`repost` posts an orphan's job again, with the details and priority it was first posted
with, so that a conductor resumes the flow from its stored state (atoms that completed do not
run again). Jobs posted by hand (TaskFlow's way, without ``post_flow``) carry no board mark and
are never reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import endings
from flowengine.jobs.records import JobPriority

if TYPE_CHECKING:
    from flowengine.jobs.base import Job, JobBoard
    from flowengine.persistence import base as persistence_base
    from flowengine.persistence import models

__all__ = ["FINISHED", "HOLDING_KEY", "Orphan", "find_orphans", "repost"]

#: Flow states after which a flow needs no job.
FINISHED = frozenset({states.SUCCESS, states.REVERTED, states.FAILURE})
#: The key of a conductor's registration metadata listing the logbooks it runs.
HOLDING_KEY = "books"


@dataclasses.dataclass(frozen=True)
class Orphan:
    """An orphaned flow (see the module).

    Attributes:
        flow_uuid: The flow detail.
        flow_name: Its name.
        state: Its stored state (None: never loaded by an engine).
        book_uuid: Its logbook, which the job named.
        book_name: The logbook's name (the job's name, as ``post_flow`` posts it).
        details: The details the job was posted with (``store``, ``flow_uuid``...).
        priority: The priority it was posted with.
    """

    flow_uuid: str
    flow_name: str
    state: str | None
    book_uuid: str
    book_name: str
    details: dict[str, Any]
    priority: JobPriority

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (``details`` left out: they may hold store values)."""
        return {"flow_uuid": self.flow_uuid, "flow_name": self.flow_name, "state": self.state,
                "book_uuid": self.book_uuid, "book_name": self.book_name,
                "priority": self.priority.value}


def _pointed_at(board: JobBoard) -> set[str]:
    """The logbooks the board's jobs, its trash and its live conductors name."""
    found = {job.book_uuid for job in board.iterjobs(ensure_fresh=True) if job.book_uuid}
    for trashed in board.iter_trash():
        book = trashed.posting.get("book")
        if isinstance(book, dict) and isinstance(book.get("uuid"), str):
            found.add(book["uuid"])
    for entity in board.iter_entities("conductor"):
        held = entity.metadata.get(HOLDING_KEY)
        if isinstance(held, list):
            found.update(str(uuid) for uuid in held if uuid)
    return found


def _orphans_of(book: models.LogBook, flows: list[models.FlowDetail]) -> list[Orphan]:
    mark = book.meta.get(endings.META_KEY)
    mark = mark if isinstance(mark, dict) else {}
    details = dict(mark["details"]) if isinstance(mark.get("details"), dict) else {}
    try:
        priority = JobPriority.convert(mark.get("priority") or JobPriority.NORMAL)
    except ValueError:
        priority = JobPriority.NORMAL
    wanted = details.get("flow_uuid")
    return [Orphan(flow_uuid=fd.uuid, flow_name=fd.name, state=fd.state, book_uuid=book.uuid,
                   book_name=book.name, details=details, priority=priority)
            for fd in flows if fd.state not in FINISHED and (wanted in (None, fd.uuid))]


def find_orphans(board: JobBoard, persistence: persistence_base.Backend) -> list[Orphan]:
    """The flows orphaned on ``board`` (see the module), by logbook name.

    Raises:
        flowengine.exceptions.JobFailure: If the board cannot be read.
        flowengine.exceptions.StorageFailure: If persistence cannot be read.
    """
    pointed = _pointed_at(board)
    found: list[Orphan] = []
    with contextlib.closing(persistence.get_connection()) as conn:
        for book in list(conn.get_logbooks(lazy=True)):
            if endings.board_of(book) != board.identity or book.uuid in pointed \
                    or endings.ending_of(book) is not None:
                continue
            try:
                flows = list(conn.get_flows_for_book(book.uuid, lazy=True))
            except exc.NotFound:
                # Deleted since it was listed (a conductor with delete_logbook=True finishing
                # its job): a flow that is gone is not orphaned.
                continue
            found += _orphans_of(book, flows)
    return sorted(found, key=lambda o: (o.book_name, o.flow_uuid))


def repost(board: JobBoard, persistence: persistence_base.Backend, orphan: Orphan) -> Job:
    """Post ``orphan``'s job again (its logbook, details and priority), for a conductor to
    resume its flow.

    Raises:
        flowengine.exceptions.NotFound: If its logbook is gone.
        flowengine.exceptions.JobFailure: If the board refuses the post.
    """
    with contextlib.closing(persistence.get_connection()) as conn:
        book = conn.get_logbook(orphan.book_uuid, lazy=True)
    return board.post(book.name, book, details=dict(orphan.details), priority=orphan.priority)
