"""Rows to models and back: the SQL implementation of a record-store session."""

from __future__ import annotations

import datetime
import functools
from typing import Any

import sqlalchemy as sa

from flowengine.persistence import _codec, fencing, models, state_times
from flowengine.persistence._store import Session, Skip, decode_all
from flowengine.persistence.backends._sql.tables import Tables

# Columns holding JSON text, per record table.
_ATOM_JSON = ("version", "meta", "results", "failure", "revert_results", "revert_failure")

# Bound parameters per IN (...) list, well under every database's limit.
_CHUNK = 500


@functools.lru_cache(maxsize=8)
def _replace_statement(table: sa.Table) -> sa.Update:
    """``UPDATE atomdetails ... WHERE uuid = :b_uuid``, built once (building costs per save)."""
    columns = ("name", "state", "intention", "atom_type", "updated_at", "times", *_ATOM_JSON)
    return (
        sa.update(table)
        .where(table.c.uuid == sa.bindparam("b_uuid"))
        .values({name: sa.bindparam(name) for name in columns})
    )


@functools.lru_cache(maxsize=8)
def _replace_of_statement(table: sa.Table) -> sa.Update:
    """``UPDATE atomdetails ... WHERE uuid = :b_uuid AND parent_uuid = :b_flow``, built once."""
    return _replace_statement(table).where(table.c.parent_uuid == sa.bindparam("b_flow"))


@functools.lru_cache(maxsize=8)
def _replace_sql(table: sa.Table, dialect: Any) -> tuple[str, tuple[str, ...] | None]:
    """The replace statement rendered for ``dialect`` once: (SQL, positional parameter order)."""
    compiled = _replace_statement(table).compile(dialect=dialect)
    order = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
    return compiled.string, order


def atom_values(ad: models.AtomDetail, where: str) -> dict[str, Any]:
    """An atom detail's column values (JSON columns encoded), without its uuid and parent."""
    data = ad.to_dict()
    values: dict[str, Any] = {
        "name": ad.name,
        "state": ad.state,
        "intention": ad.intention,
        "atom_type": models.atom_detail_type(ad),
    }
    for column in _ATOM_JSON:
        value = data[column]
        values[column] = None if value is None else _codec.dumps(value, where, _codec.ATOM, ad.uuid)
    values["times"] = _times_text(ad.times, where, _codec.ATOM, ad.uuid)
    return values


def _times_text(times: dict[str, float], where: str, kind: str, uuid: str) -> str | None:
    # NULL when none were recorded: what an upgraded database holds for older records.
    return _codec.dumps(times, where, kind, uuid) if times else None


def _flow_updated(fd: models.FlowDetail) -> dict[str, datetime.datetime]:
    """The ``updated_at`` a flow row is written with: its last state change (naive UTC), the
    flow's "updated" time everywhere (see ``state_times.updated``); none recorded: nothing,
    and the column takes the time of the write."""
    when = state_times.updated(fd)
    if when is None:
        return {}
    return {"updated_at": datetime.datetime.fromtimestamp(when, datetime.UTC).replace(tzinfo=None)}


def _replacing(ad: models.AtomDetail, where: str) -> dict[str, Any]:
    """The parameters of the replace statements: ``ad``'s columns, its uuid, and now."""
    values = atom_values(ad, where)
    values["b_uuid"] = ad.uuid
    values["updated_at"] = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    return values


def replace_atom_sql(table: sa.Table, dialect: Any, ad: models.AtomDetail,
                     where: str) -> tuple[str, Any]:
    """The one UPDATE overwriting ``ad``'s row, as DB-API SQL for ``dialect``, and its parameters.

    Run on a raw DB-API connection (see ``_SQLStore.replace_atom``): an atom state change then
    costs one statement and no SQLAlchemy statement building or transaction bookkeeping.
    """
    values = _replacing(ad, where)
    sql, order = _replace_sql(table, dialect)
    return sql, tuple(values[name] for name in order) if order else values


class SQLSession(Session):
    """A transaction on one SQLAlchemy connection.

    Args:
        conn: The connection, inside a transaction.
        tables: The schema's tables.
        where: Names the backend in messages.
        write: Whether rows read are locked (``SELECT ... FOR UPDATE`` where the database has it)
            so concurrent read-merge-writes of one record take turns.
    """

    def __init__(self, conn: sa.Connection, tables: Tables, where: str, write: bool) -> None:
        self._conn = conn
        self._t = tables
        self._where = where
        self._write = write

    def _loads(self, text: str | None, kind: str, uuid: str) -> Any:
        return None if text is None else _codec.loads(text, self._where, kind, uuid)

    def _dumps(self, value: Any, kind: str, uuid: str) -> str | None:
        return None if value is None else _codec.dumps(value, self._where, kind, uuid)

    def _select(self, table: sa.Table, where: Any) -> list[sa.Row[Any]]:
        query = sa.select(table).where(where)
        if self._write:
            query = query.with_for_update()
        return list(self._conn.execute(query))

    def _book(self, row: sa.Row[Any]) -> models.LogBook:
        uuid = row.uuid
        with _codec.decoding(self._where, _codec.BOOK, uuid):
            book = models.LogBook(row.name, uuid=uuid)
            book.meta = self._loads(row.meta, _codec.BOOK, uuid) or {}
            book.created_at = row.created_at
            book.updated_at = row.updated_at
            if not isinstance(book.meta, dict):
                raise TypeError(f"meta is a {type(book.meta).__name__}, not an object")
            return book

    def _flow(self, row: sa.Row[Any]) -> models.FlowDetail:
        uuid = row.uuid
        with _codec.decoding(self._where, _codec.FLOW, uuid):
            meta = self._loads(row.meta, _codec.FLOW, uuid)
            data = {"uuid": uuid, "name": row.name, "state": row.state, "meta": meta}
            fd = models.FlowDetail.from_dict(data)
            fd.times = self._times(row, _codec.FLOW, uuid)
            fd.fencing_token = fencing.recorded(row.fencing_token)
            return fd

    def _atom(self, row: sa.Row[Any]) -> models.AtomDetail:
        uuid = row.uuid
        with _codec.decoding(self._where, _codec.ATOM, uuid):
            data = {"uuid": uuid, "name": row.name, "state": row.state}
            data["intention"] = row.intention
            for column in _ATOM_JSON:
                data[column] = self._loads(getattr(row, column), _codec.ATOM, uuid)
            ad = models.atom_detail_class(row.atom_type).from_dict(data)
            ad.times = self._times(row, _codec.ATOM, uuid)
            return ad

    def _times(self, row: sa.Row[Any], kind: str, uuid: str) -> dict[str, float]:
        return state_times.recorded(self._loads(row.times, kind, uuid))

    def get_book(self, uuid: str) -> models.LogBook | None:
        rows = self._select(self._t.logbooks, self._t.logbooks.c.uuid == uuid)
        return self._book(rows[0]) if rows else None

    def get_flow(self, uuid: str) -> models.FlowDetail | None:
        rows = self._select(self._t.flowdetails, self._t.flowdetails.c.uuid == uuid)
        return self._flow(rows[0]) if rows else None

    def get_atom(self, uuid: str) -> models.AtomDetail | None:
        rows = self._select(self._t.atomdetails, self._t.atomdetails.c.uuid == uuid)
        return self._atom(rows[0]) if rows else None

    def books(self, skip: Skip = None) -> list[models.LogBook]:
        query = sa.select(self._t.logbooks).order_by(self._t.logbooks.c.created_at)
        return decode_all(self._conn.execute(query), self._book, skip)

    def flows_of(self, book_uuid: str, skip: Skip = None) -> list[models.FlowDetail]:
        table = self._t.flowdetails
        query = sa.select(table).where(table.c.parent_uuid == book_uuid).order_by(table.c.uuid)
        return decode_all(self._conn.execute(query), self._flow, skip)

    def atoms_of(self, flow_uuid: str) -> list[models.AtomDetail]:
        return self.atoms_by_flow([flow_uuid]).get(flow_uuid, [])

    def atoms_by_flow(self, flow_uuids: list[str]) -> dict[str, list[models.AtomDetail]]:
        table = self._t.atomdetails
        found: dict[str, list[models.AtomDetail]] = {uuid: [] for uuid in flow_uuids}
        for start in range(0, len(flow_uuids), _CHUNK):
            chunk = flow_uuids[start : start + _CHUNK]
            query = sa.select(table).where(table.c.parent_uuid.in_(chunk)).order_by(table.c.uuid)
            for row in self._conn.execute(query):
                found[row.parent_uuid].append(self._atom(row))
        return found

    def put_book(self, book: models.LogBook, new: bool) -> None:
        table = self._t.logbooks
        values = {
            "name": book.name,
            "meta": self._dumps(book.meta, _codec.BOOK, book.uuid),
            "created_at": book.created_at,
            "updated_at": book.updated_at,
        }
        self._put(table, book.uuid, values, new)

    def put_flow(self, fd: models.FlowDetail, book_uuid: str | None, new: bool) -> None:
        values = {
            "name": fd.name,
            "state": fd.state,
            "meta": self._dumps(fd.meta, _codec.FLOW, fd.uuid),
            "times": _times_text(fd.times, self._where, _codec.FLOW, fd.uuid),
            # Merged with the stored one, read in this transaction: it never goes down.
            "fencing_token": fd.fencing_token,
            **_flow_updated(fd),
        }
        if new:
            values["parent_uuid"] = book_uuid
        self._put(self._t.flowdetails, fd.uuid, values, new)

    def fencing_token(self, flow_uuid: str) -> int | None:
        # The flow's row alone, locked (a write session) until the write it fences commits.
        table = self._t.flowdetails
        query = sa.select(table.c.fencing_token).where(table.c.uuid == flow_uuid)
        if self._write:
            query = query.with_for_update()
        return fencing.recorded(self._conn.execute(query).scalar())

    def set_fencing_token(self, flow_uuid: str, token: int) -> None:
        table = self._t.flowdetails
        self._conn.execute(sa.update(table).where(table.c.uuid == flow_uuid)
                           .values(fencing_token=token, updated_at=table.c.updated_at))

    def holds_atom(self, flow_uuid: str, atom_uuid: str) -> bool:
        table = self._t.atomdetails
        query = sa.select(table.c.uuid).where(table.c.uuid == atom_uuid,
                                              table.c.parent_uuid == flow_uuid)
        return self._conn.execute(query).first() is not None

    def replace_atom_of(self, flow_uuid: str, ad: models.AtomDetail) -> bool:
        values = _replacing(ad, self._where)
        values["b_flow"] = flow_uuid
        result = self._conn.execute(_replace_of_statement(self._t.atomdetails), values)
        return result.rowcount > 0

    def put_atom(self, ad: models.AtomDetail, flow_uuid: str | None, new: bool) -> None:
        values = atom_values(ad, self._where)
        if new:
            values["parent_uuid"] = flow_uuid
        self._put(self._t.atomdetails, ad.uuid, values, new)

    def insert_atoms(self, ads: list[models.AtomDetail], flow_uuid: str) -> None:
        if not ads:
            return
        rows = [{"uuid": ad.uuid, "parent_uuid": flow_uuid, **atom_values(ad, self._where)}
                for ad in ads]
        # One executemany: building an INSERT statement per atom costs more than running it.
        self._conn.execute(sa.insert(self._t.atomdetails), rows)

    def _put(self, table: sa.Table, uuid: str, values: dict[str, Any], new: bool) -> None:
        if new:
            self._conn.execute(sa.insert(table).values(uuid=uuid, **values))
        else:
            self._conn.execute(sa.update(table).where(table.c.uuid == uuid).values(**values))

    def delete_book(self, uuid: str) -> None:
        # Explicit, children first: SQLite enforces ON DELETE CASCADE only when told to.
        flows = sa.select(self._t.flowdetails.c.uuid).where(
            self._t.flowdetails.c.parent_uuid == uuid
        )
        atoms = self._t.atomdetails
        self._conn.execute(sa.delete(atoms).where(atoms.c.parent_uuid.in_(flows)))
        flowdetails = self._t.flowdetails
        self._conn.execute(sa.delete(flowdetails).where(flowdetails.c.parent_uuid == uuid))
        logbooks = self._t.logbooks
        self._conn.execute(sa.delete(logbooks).where(logbooks.c.uuid == uuid))

    def clear(self) -> None:
        for table in (self._t.atomdetails, self._t.flowdetails, self._t.logbooks):
            self._conn.execute(sa.delete(table))
