"""Finding stored flows a page at a time: filtered, newest first, paginated by the backend.

Operator tools list flows in pages. On SQL backends the filter, order, count and page are one
indexed query each, so the first page costs the same with a hundred or a hundred thousand stored
flows; the other backends read their logbooks and filter in memory (they hold fewer flows).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any

from flowengine.persistence import base, models

__all__ = ["FlowPage", "FlowQuery", "FlowRow", "find_flows"]

#: Most flows one page may hold.
MAX_LIMIT = 500


@dataclasses.dataclass(frozen=True)
class FlowQuery:
    """Which stored flows to list, and which page of them.

    Attributes:
        states: Only flows in one of these states (empty: any).
        name: Only flows whose name contains this text (case-insensitive).
        uuid: Only flows whose uuid starts with this.
        since: Only flows updated at or after this time (naive UTC, as stored).
        until: Only flows updated before this time (naive UTC).
        offset: Flows skipped before the page.
        limit: Most flows on the page (1 to :data:`MAX_LIMIT`).
    """

    states: tuple[str, ...] = ()
    name: str | None = None
    uuid: str | None = None
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    offset: int = 0
    limit: int = 50

    def __post_init__(self) -> None:
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
    rows.sort(key=lambda r: (r.updated_at or datetime.datetime.min, r.uuid), reverse=True)
    return FlowPage(rows[query.offset:query.offset + query.limit], len(rows), query)


def _scan(conn: base.Connection) -> Iterable[FlowRow]:
    for book in conn.get_logbooks(lazy=True):
        for fd in conn.get_flows_for_book(book.uuid, lazy=True):
            yield _row(fd, book)


def _row(fd: models.FlowDetail, book: models.LogBook) -> FlowRow:
    return FlowRow(fd.uuid, fd.name, fd.state, book.uuid, book.name, book.updated_at)


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
    page = (sa.select(flows.c.uuid, flows.c.name, flows.c.state, flows.c.parent_uuid,
                      flows.c.updated_at, books.c.name.label("book"))
            .select_from(flows.outerjoin(books, books.c.uuid == flows.c.parent_uuid))
            .where(*where)
            .order_by(flows.c.updated_at.desc(), flows.c.uuid.desc())
            .offset(query.offset).limit(query.limit))
    count = sa.select(sa.func.count()).select_from(flows).where(*where)
    with engine.connect() as conn:
        rows = [FlowRow(r.uuid, r.name, r.state, r.parent_uuid, r.book, r.updated_at)
                for r in conn.execute(page)]
        total = int(conn.execute(count).scalar() or 0)
    return FlowPage(rows, total, query)


def _escape(text: str) -> str:
    """``text`` matched literally inside a LIKE pattern."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
