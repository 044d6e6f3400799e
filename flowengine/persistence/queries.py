"""Finding stored flows a page at a time: filtered, newest first, paginated by the backend.

Operator tools list flows in pages. On SQL backends the filter, order, count and page are one
indexed query each, so the first page costs the same with a hundred or a hundred thousand stored
flows; the other backends read their logbooks and filter in memory (they hold fewer flows).

A page is found by its offset, or (keyset pagination) by the sort key of the row just before or
after it (:class:`FlowCursor`): ``OFFSET 25000`` makes the database read and drop 25,000 rows,
while a cursor seeks the ``(updated_at, uuid)`` index straight to the page, so the next and
previous pages of a deep page cost what the first page does.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any

from flowengine.persistence import base, models, state_times

__all__ = ["FlowCursor", "FlowPage", "FlowQuery", "FlowRow", "find_flows"]

#: Most flows one page may hold.
MAX_LIMIT = 500


@dataclasses.dataclass(frozen=True, order=True)
class FlowCursor:
    """A row's place in the newest-first order: its update time, then its uuid.

    Attributes:
        updated_at: The row's update time (naive UTC, as stored).
        uuid: The row's uuid (breaks ties between rows updated at the same time).
    """

    updated_at: datetime.datetime
    uuid: str

    def text(self) -> str:
        """The cursor as a query-string value (``parse`` reads it back)."""
        return f"{self.updated_at.isoformat()}~{self.uuid}"

    @classmethod
    def parse(cls, text: str) -> FlowCursor:
        """Read a cursor written by :meth:`text`.

        Raises:
            ValueError: ``text`` is not a cursor (the message quotes it).
        """
        when, sep, uuid = text.partition("~")
        try:
            if not sep or not uuid:
                raise ValueError("no '~'")
            return cls(datetime.datetime.fromisoformat(when), uuid)
        except ValueError as err:
            raise ValueError(f"page cursor {text!r} is not <ISO time>~<flow uuid>") from err


@dataclasses.dataclass(frozen=True)
class FlowQuery:
    """Which stored flows to list, and which page of them.

    Attributes:
        states: Only flows in one of these states (empty: any).
        name: Only flows whose name contains this text (case-insensitive).
        uuid: Only flows whose uuid starts with this.
        since: Only flows updated at or after this time (naive UTC, as stored).
        until: Only flows updated before this time (naive UTC).
        offset: Flows skipped before the page (ignored with a cursor).
        limit: Most flows on the page (1 to :data:`MAX_LIMIT`).
        after: The page holds the flows that come right after this one (older ones).
        before: The page holds the flows that come right before this one (newer ones).
    """

    states: tuple[str, ...] = ()
    name: str | None = None
    uuid: str | None = None
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    offset: int = 0
    limit: int = 50
    after: FlowCursor | None = None
    before: FlowCursor | None = None

    def __post_init__(self) -> None:
        if self.after is not None and self.before is not None:
            raise ValueError("a flow query takes a cursor to page after or before, not both")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise ValueError(f"flow query limit must be 1 to {MAX_LIMIT}, got {self.limit}")
        if self.offset < 0:
            raise ValueError(f"flow query offset must not be negative, got {self.offset}")


@dataclasses.dataclass(frozen=True)
class FlowRow:
    """One stored flow as a listing shows it (its atoms are not loaded)."""

    uuid: str
    name: str
    state: str | None
    book_uuid: str | None
    book: str | None
    updated_at: datetime.datetime | None


@dataclasses.dataclass(frozen=True)
class FlowPage:
    """A page of flows and how many flows match the query in all."""

    rows: list[FlowRow]
    total: int
    query: FlowQuery

    @property
    def first(self) -> FlowCursor | None:
        """The cursor of the page's first row (None: no rows, or no update time)."""
        return _cursor(self.rows[0]) if self.rows else None

    @property
    def last(self) -> FlowCursor | None:
        """The cursor of the page's last row (None: no rows, or no update time)."""
        return _cursor(self.rows[-1]) if self.rows else None


def _cursor(row: FlowRow) -> FlowCursor | None:
    return None if row.updated_at is None else FlowCursor(row.updated_at, row.uuid)


def find_flows(backend: base.Backend, query: FlowQuery) -> FlowPage:
    """The page of stored flows ``query`` asks for, most recently updated first.

    Raises:
        flowengine.exceptions.StorageFailure: The backend cannot be read.
    """
    engine = getattr(backend, "engine", None)
    if engine is not None:
        return _find_sql(engine, query)
    conn = backend.get_connection()
    try:
        rows = [row for row in _scan(conn) if _matches(row, query)]
    finally:
        conn.close()
    rows.sort(key=_key, reverse=True)
    total = len(rows)
    if query.after is not None:
        after = query.after
        rows = [row for row in rows if _key(row) < (after.updated_at, after.uuid)]
    elif query.before is not None:
        before = query.before
        rows = [row for row in rows if _key(row) > (before.updated_at, before.uuid)]
        rows = rows[-query.limit:]
    else:
        rows = rows[query.offset:]
    return FlowPage(rows[:query.limit], total, query)


def _key(row: FlowRow) -> tuple[datetime.datetime, str]:
    return (row.updated_at or datetime.datetime.min, row.uuid)


def _scan(conn: base.Connection) -> Iterable[FlowRow]:
    for book in conn.get_logbooks(lazy=True):
        for fd in conn.get_flows_for_book(book.uuid, lazy=True):
            yield _row(fd, book)


def _row(fd: models.FlowDetail, book: models.LogBook) -> FlowRow:
    # The flow's "updated" time as everywhere (state_times.updated), naive UTC as the SQL
    # backend keeps it in the flow row's updated_at.
    updated = state_times.updated(fd, book.updated_at)
    when = (None if updated is None else datetime.datetime.fromtimestamp(updated, datetime.UTC)
            .replace(tzinfo=None))
    return FlowRow(fd.uuid, fd.name, fd.state, book.uuid, book.name, when)


def _matches(row: FlowRow, query: FlowQuery) -> bool:
    when = row.updated_at
    return ((not query.states or row.state in query.states)
            and (not query.name or query.name.lower() in (row.name or "").lower())
            and (not query.uuid or row.uuid.startswith(query.uuid))
            and (query.since is None or (when is not None and when >= query.since))
            and (query.until is None or (when is not None and when < query.until)))


def _find_sql(engine: Any, query: FlowQuery) -> FlowPage:
    import sqlalchemy as sa

    from flowengine.persistence.backends._sql import tables

    t = tables.define(sa.MetaData())
    flows, books = t.flowdetails, t.logbooks
    where: list[Any] = []
    if query.states:
        where.append(flows.c.state.in_(query.states))
    if query.name:
        where.append(flows.c.name.ilike(f"%{_escape(query.name)}%", escape="\\"))
    if query.uuid:
        where.append(flows.c.uuid.like(f"{_escape(query.uuid)}%", escape="\\"))
    if query.since is not None:
        where.append(flows.c.updated_at >= query.since)
    if query.until is not None:
        where.append(flows.c.updated_at < query.until)
    count = sa.select(sa.func.count()).select_from(flows).where(*where)
    key = sa.tuple_(flows.c.updated_at, flows.c.uuid)
    page = (sa.select(flows.c.uuid, flows.c.name, flows.c.state, flows.c.parent_uuid,
                      flows.c.updated_at, books.c.name.label("book"))
            .select_from(flows.outerjoin(books, books.c.uuid == flows.c.parent_uuid))
            .limit(query.limit))
    newest_first = (flows.c.updated_at.desc(), flows.c.uuid.desc())
    if query.after is not None:
        cursor = query.after
        page = page.where(*where, key < sa.tuple_(cursor.updated_at, cursor.uuid)
                          ).order_by(*newest_first)
    elif query.before is not None:
        # Seek the other way, then turn the rows round.
        cursor = query.before
        page = page.where(*where, key > sa.tuple_(cursor.updated_at, cursor.uuid)
                          ).order_by(flows.c.updated_at.asc(), flows.c.uuid.asc())
    else:
        page = page.where(*where).order_by(*newest_first).offset(query.offset)
    with engine.connect() as conn:
        rows = [FlowRow(r.uuid, r.name, r.state, r.parent_uuid, r.book, r.updated_at)
                for r in conn.execute(page)]
        total = int(conn.execute(count).scalar() or 0)
    if query.before is not None:
        rows.reverse()
    return FlowPage(rows, total, query)


def _escape(text: str) -> str:
    """``text`` matched literally inside a LIKE pattern."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
