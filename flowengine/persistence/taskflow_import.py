"""Copying a TaskFlow 6.x store into a flowengine store, flows in flight included.

What ``flowengine db import-taskflow --from URL --backend URL`` runs. Every logbook, flow
detail and atom detail keeps its uuid, name, state, intention, results, failures (TaskFlow's
failure dicts become :class:`~flowengine.types.failure.Failure` objects), retry history,
version and metadata, so a flow a TaskFlow engine left RUNNING or SUSPENDED is resumed by a
flowengine engine from the copy and runs only what had not finished, and jobs and services that
name a logbook or flow by uuid find it in the new store.

The TaskFlow store is read, never written (see :mod:`flowengine.persistence.taskflow_store`).
Each imported flow detail carries a mark in its metadata (``taskflow_import``: where from, when,
and a digest of what was copied), which makes the import safe to run again:

* a flow not in the target yet is copied (a new logbook with all its flows in one save);
* a flow copied before and unchanged on both sides is left alone;
* a flow copied before that only TaskFlow changed since (an engine still ran) is copied again;
* a flow flowengine changed since it was copied (it resumed it, say) is kept as flowengine left
  it, and so is a flow of that uuid that did not come from TaskFlow;
* a flow with a damaged record (or a damaged atom) is not copied, and is named in the report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import _codec, base, layout, models
from flowengine.persistence._store import Session
from flowengine.persistence.backends._uri import mask_urls
from flowengine.persistence.taskflow_store import TaskFlowStoreError, opened

__all__ = ["MARK", "FlowImport", "ImportReport", "TaskFlowStoreError", "import_taskflow"]

#: The flow detail metadata key marking a flow copied from TaskFlow.
MARK = "taskflow_import"

IMPORTED = "imported"
REFRESHED = "refreshed"
UNCHANGED = "unchanged"
KEPT = "kept"
REFUSED = "refused"

#: Flow states a flow has ended in; any other is in flight (a flowengine engine resumes it).
_ENDED = frozenset({states.SUCCESS, states.REVERTED, states.FAILURE})


@dataclasses.dataclass(frozen=True)
class FlowImport:
    """What the import did with one flow detail (or one logbook it could not read).

    Attributes:
        uuid: The flow detail's uuid (the logbook's, for a logbook that could not be read).
        name: Its name (empty when its record could not be read).
        book: The uuid of its logbook.
        state: Its state in the TaskFlow store.
        outcome: ``imported``, ``refreshed``, ``unchanged``, ``kept`` or ``refused``.
        reason: Why it was kept or refused.
    """

    uuid: str
    name: str
    book: str
    state: str | None
    outcome: str
    reason: str = ""

    @property
    def in_flight(self) -> bool:
        """Whether the flow is in the target as TaskFlow left it, in a state a flowengine engine
        resumes from."""
        return self.outcome in (IMPORTED, REFRESHED, UNCHANGED) and self.state not in _ENDED


@dataclasses.dataclass
class ImportReport:
    """What one import did.

    Attributes:
        source: The TaskFlow store (password masked).
        target: The flowengine store.
        layout_steps: What was done to the target's layout first (``flowengine db upgrade``).
        books_added: Logbooks created in the target.
        flows: One entry per flow detail read (and per logbook that could not be read).
    """

    source: str
    target: str
    layout_steps: list[str] = dataclasses.field(default_factory=list)
    books_added: int = 0
    flows: list[FlowImport] = dataclasses.field(default_factory=list)

    def count(self, outcome: str) -> int:
        """How many flows had ``outcome``."""
        return sum(1 for flow in self.flows if flow.outcome == outcome)

    @property
    def in_flight(self) -> list[FlowImport]:
        """The flows copied in a state a flowengine engine resumes from."""
        return [flow for flow in self.flows if flow.in_flight]

    @property
    def complete(self) -> bool:
        """Whether every record was read (nothing refused)."""
        return self.count(REFUSED) == 0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-friendly data."""
        return {
            "source": self.source,
            "target": self.target,
            "layout_steps": list(self.layout_steps),
            "books_added": self.books_added,
            "counts": {o: self.count(o) for o in (IMPORTED, REFRESHED, UNCHANGED, KEPT, REFUSED)},
            "flows": [dict(dataclasses.asdict(flow), in_flight=flow.in_flight)
                      for flow in self.flows],
        }


def digest(fd: models.FlowDetail) -> str:
    """A digest of a flow detail and its atoms as stored, leaving out the import mark."""
    flow = _codec.flow_record(fd)
    flow["meta"] = {key: value for key, value in fd.meta.items() if key != MARK}
    atoms = sorted((_codec.atom_record(ad) for ad in fd), key=lambda r: str(r["atom"]["uuid"]))
    text = json.dumps({"flow": flow, "atoms": atoms}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Importer:
    def __init__(self, source: Session, conn: base.Connection, report: ImportReport,
                 now: Callable[[], float]) -> None:
        self._source = source
        self._conn = conn
        self._report = report
        self._now = now

    def _refuse(self, err: base.CorruptRecord, book: str, fd: models.FlowDetail | None = None
                ) -> None:
        uuid, name, state = (fd.uuid, fd.name, fd.state) if fd is not None else (err.uuid, "",
                                                                                  None)
        # The first line: the error's cause follows on the next ones.
        reason = (str(err).splitlines() or [""])[0]
        self._report.flows.append(FlowImport(uuid, name, book, state, REFUSED, reason))

    def run(self) -> None:
        books = self._source.books(skip=lambda err: self._refuse(err, err.uuid))
        for book in books:
            self._book(book)

    def _read_flows(self, book: models.LogBook) -> list[models.FlowDetail]:
        flows = self._source.flows_of(book.uuid, skip=lambda err: self._refuse(err, book.uuid))
        try:
            atoms = self._source.atoms_by_flow([fd.uuid for fd in flows])
        except base.CorruptRecord:
            atoms = {}  # rare: read flow by flow, to tell which flows hold a damaged atom
        whole = []
        for fd in flows:
            try:
                found = atoms[fd.uuid] if fd.uuid in atoms else self._source.atoms_of(fd.uuid)
            except base.CorruptRecord as err:
                # Never copied without an atom: a resumed engine would run that atom again.
                self._refuse(err, book.uuid, fd)
                continue
            for ad in found:
                fd.add(ad)
            whole.append(fd)
        return whole

    def _target_flows(self, book_uuid: str) -> dict[str, models.FlowDetail]:
        """The flows of the target's copy of a logbook, read in one go (running again)."""
        try:
            return {fd.uuid: fd for fd in self._conn.get_flows_for_book(book_uuid)}
        except base.CorruptRecord:
            return {}  # each flow is then looked up, and a damaged one kept as it is

    def _book(self, book: models.LogBook) -> None:
        try:
            target: models.LogBook | None = self._conn.get_logbook(book.uuid, lazy=True)
        except exc.NotFound:
            target = None
        in_target = {} if target is None else self._target_flows(book.uuid)
        added: list[models.FlowDetail] = []
        for fd in self._read_flows(book):
            outcome, reason = self._decide(fd, in_target.get(fd.uuid))
            self._report.flows.append(FlowImport(fd.uuid, fd.name, book.uuid, fd.state,
                                                 outcome, reason))
            if outcome in (IMPORTED, REFRESHED):
                self._mark(fd)
            if outcome == IMPORTED:
                added.append(fd)
            elif outcome == REFRESHED:
                self._conn.update_flow_details(fd)
        if target is None:
            target = book.copy(retain_contents=False)
            for fd in added:
                target.add(fd)
            target.updated_at = book.updated_at  # as TaskFlow left it (add() stamps it)
            self._report.books_added += 1
        elif added:
            for fd in added:
                target.add(fd)
        else:
            return
        # One save: on a SQL store a logbook and its new flows are written in one transaction.
        self._conn.save_logbook(target)

    def _decide(self, fd: models.FlowDetail, stored: models.FlowDetail | None
                ) -> tuple[str, str]:
        if stored is None:
            # Not in its logbook's copy: the uuid may still be taken, in another logbook.
            try:
                stored = self._conn.get_flow_details(fd.uuid)
            except exc.NotFound:
                return IMPORTED, ""
            except base.CorruptRecord as err:
                reason = (str(err).splitlines() or [""])[0]
                return KEPT, f"the target's copy cannot be read ({reason}); left as it is"
        mark = stored.meta.get(MARK)
        if not isinstance(mark, dict):
            return KEPT, "a flow with this uuid is in the target already, not copied from TaskFlow"
        if mark.get("digest") != digest(stored):
            return KEPT, ("flowengine has changed it since it was copied (resumed it, say);"
                          " flowengine's record is kept")
        if mark["digest"] == digest(fd):
            return UNCHANGED, ""
        return REFRESHED, "TaskFlow changed it since it was copied, flowengine has not"

    def _mark(self, fd: models.FlowDetail) -> None:
        when = datetime.datetime.fromtimestamp(self._now(), datetime.UTC)
        fd.meta = dict(fd.meta)
        fd.meta[MARK] = {"from": self._report.source,
                         "at": when.isoformat(timespec="seconds").replace("+00:00", "Z"),
                         "digest": digest(fd)}


def import_taskflow(source_url: str, target: base.Backend,
                    now: Callable[[], float] = time.time) -> ImportReport:
    """Copy the TaskFlow store at ``source_url`` into ``target``; safe to run again.

    The target's layout is created or upgraded first (as ``flowengine db upgrade`` does).
    Stop the TaskFlow engines and conductors using the store before: a flow an engine still
    runs would be copied as it was at that moment (running the import again once they have
    stopped copies it again, as long as no flowengine engine has resumed it yet).

    Args:
        source_url: The TaskFlow store: ``sqlite:///path``, ``postgresql://...``,
            ``mysql://...`` or ``dir:///path``.
        target: The flowengine store to copy into; not the same tables (TaskFlow's and
            flowengine's have the same names) nor, for a directory, the same directory.
        now: The clock stamping the import marks (seconds since the epoch).

    Returns:
        What was done with every flow; flows that could not be read are in it as ``refused``
        (every other flow is copied all the same).

    Raises:
        TaskFlowStoreError: If the TaskFlow store cannot be read at all (the message says why).
        flowengine.exceptions.StorageFailure: If the target cannot be used (a TaskFlow store
            itself, say; :class:`~flowengine.persistence.base.IncompatibleSchema`) or a write
            fails; what was saved before stays, and running again goes on from there.
    """
    with opened(source_url) as source:
        # Only once the TaskFlow store could be opened: a wrong --from leaves the target alone.
        steps = layout.upgrade(target)
        report = ImportReport(source=f"TaskFlow store '{mask_urls(source_url)}'",
                              target=layout.describe(target), layout_steps=steps)
        with contextlib.closing(target.get_connection()) as conn:
            _Importer(source, conn, report, now).run()
    return report
