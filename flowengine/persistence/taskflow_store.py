"""Reading a TaskFlow 6.x store as flowengine records, without changing it.

TaskFlow keeps logbooks, flow details and atom details in a SQL database (its SQLAlchemy
backend: SQLite, PostgreSQL, MySQL) or in a directory (its ``dir`` backend). Both hold the same
records flowengine does, in TaskFlow's record layout: results, metadata and TaskFlow's
version-1 failure dicts as JSON, states and intentions as TaskFlow's strings. :func:`opened`
reads either as a read-only :class:`~flowengine.persistence._store.Session`, whose records are
flowengine models (TaskFlow's failure dicts become :class:`~flowengine.types.failure.Failure`
objects); ``flowengine db import-taskflow`` copies them into a flowengine store.

Nothing is written to the store: a SQLite file is opened read-only, a PostgreSQL transaction is
``READ ONLY`` (and ``REPEATABLE READ``, so the records read are one consistent snapshot), and a
directory is read without creating flowengine's lock file in it. So the TaskFlow store stays
as it was, for a TaskFlow service to go back to.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy import pool as sa_pool

from flowengine.persistence import _codec, models
from flowengine.persistence._store import Session, Skip, decode_all
from flowengine.persistence.backends._sql.engine import normalize_url
from flowengine.persistence.backends._sql.tables import SCHEMA_TABLE
from flowengine.persistence.backends._uri import mask_urls, split_conf
from flowengine.persistence.backends.impl_dir import reading_session

__all__ = ["opened", "TaskFlowStoreError"]

_SQL_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql")
_DIR_SCHEMES = ("dir", "file")

# What a TaskFlow 6.x schema has (its alembic head); older ones lack some of these columns.
_COLUMNS = {
    "logbooks": ("uuid", "name", "meta", "created_at", "updated_at"),
    "flowdetails": ("uuid", "parent_uuid", "name", "state", "meta"),
    "atomdetails": ("uuid", "parent_uuid", "name", "atom_type", "state", "intention", "version",
                    "meta", "results", "failure", "revert_results", "revert_failure"),
}
_JSON = frozenset({"meta", "results", "failure", "revert_results", "revert_failure"})
_DATES = frozenset({"created_at", "updated_at"})

# Bound parameters per IN (...) list, well under every database's limit.
_CHUNK = 500


class TaskFlowStoreError(ValueError):
    """The TaskFlow store cannot be read: wrong URL, missing, not TaskFlow's, or too old.

    The message names the store and what to do.
    """


def _table(name: str) -> sa.TableClause:
    columns = [sa.column(c, sa.DateTime if c in _DATES else sa.Text) for c in _COLUMNS[name]]
    return sa.table(name, *columns)


class _SQLReading(Session):
    """A read-only session on a TaskFlow database (one transaction)."""

    def __init__(self, conn: sa.Connection, where: str) -> None:
        self._conn = conn
        self._where = where
        self._books, self._flows, self._atoms = (_table(n) for n in _COLUMNS)
        # TaskFlow keeps JSON in native json columns on PostgreSQL, in text columns elsewhere:
        # read every one as text and decode it here, the same way on every database.
        self._as_text = conn.dialect.name == "postgresql"

    def _select(self, table: sa.TableClause) -> sa.Select[Any]:
        return sa.select(*[
            sa.cast(column, sa.Text).label(column.name)
            if self._as_text and column.name in _JSON else column
            for column in table.columns
        ])

    def _json(self, text: str | None, kind: str, uuid: str) -> Any:
        return None if text is None else _codec.loads(text, self._where, kind, uuid)

    def _book(self, row: sa.Row[Any]) -> models.LogBook:
        with _codec.decoding(self._where, _codec.BOOK, row.uuid):
            book = models.LogBook(row.name, uuid=row.uuid)
            meta = self._json(row.meta, _codec.BOOK, row.uuid)
            book.meta = meta if isinstance(meta, dict) else {}
            book.created_at, book.updated_at = row.created_at, row.updated_at
            return book

    def _flow(self, row: sa.Row[Any]) -> models.FlowDetail:
        meta = self._json(row.meta, _codec.FLOW, row.uuid)
        data = {"uuid": row.uuid, "name": row.name, "state": row.state, "meta": meta}
        with _codec.decoding(self._where, _codec.FLOW, row.uuid):
            return models.FlowDetail.from_dict(data)

    def _atom(self, row: sa.Row[Any]) -> models.AtomDetail:
        data = {name: getattr(row, name) for name in ("uuid", "name", "state", "intention",
                                                        "version")}
        for name in _JSON:
            data[name] = self._json(getattr(row, name), _codec.ATOM, row.uuid)
        with _codec.decoding(self._where, _codec.ATOM, row.uuid):
            # TaskFlow's failure dicts become Failures here (Failure.from_dict checks them).
            return models.atom_detail_class(row.atom_type).from_dict(data)

    def _one(self, table: sa.TableClause, uuid: str) -> sa.Row[Any] | None:
        return self._conn.execute(self._select(table).where(table.c.uuid == uuid)).first()

    def get_book(self, uuid: str) -> models.LogBook | None:
        row = self._one(self._books, uuid)
        return None if row is None else self._book(row)

    def get_flow(self, uuid: str) -> models.FlowDetail | None:
        row = self._one(self._flows, uuid)
        return None if row is None else self._flow(row)

    def get_atom(self, uuid: str) -> models.AtomDetail | None:
        row = self._one(self._atoms, uuid)
        return None if row is None else self._atom(row)

    def books(self, skip: Skip = None) -> list[models.LogBook]:
        table = self._books
        query = self._select(table).order_by(table.c.created_at, table.c.uuid)
        return decode_all(self._conn.execute(query), self._book, skip)

    def flows_of(self, book_uuid: str, skip: Skip = None) -> list[models.FlowDetail]:
        table = self._flows
        query = self._select(table).where(table.c.parent_uuid == book_uuid).order_by(
            table.c.uuid)
        return decode_all(self._conn.execute(query), self._flow, skip)

    def atoms_of(self, flow_uuid: str) -> list[models.AtomDetail]:
        return self.atoms_by_flow([flow_uuid])[flow_uuid]

    def atoms_by_flow(self, flow_uuids: list[str]) -> dict[str, list[models.AtomDetail]]:
        table = self._atoms
        found: dict[str, list[models.AtomDetail]] = {uuid: [] for uuid in flow_uuids}
        for start in range(0, len(flow_uuids), _CHUNK):
            chunk = flow_uuids[start : start + _CHUNK]
            query = self._select(table).where(table.c.parent_uuid.in_(chunk)).order_by(
                table.c.uuid)
            for row in self._conn.execute(query):
                found[row.parent_uuid].append(self._atom(row))
        return found

    def _read_only(self) -> NotImplementedError:
        return NotImplementedError(f"{self._where} is read, never written")

    def put_book(self, book: models.LogBook, new: bool) -> None:
        raise self._read_only()

    def put_flow(self, fd: models.FlowDetail, book_uuid: str | None, new: bool) -> None:
        raise self._read_only()

    def put_atom(self, ad: models.AtomDetail, flow_uuid: str | None, new: bool) -> None:
        raise self._read_only()

    def delete_book(self, uuid: str) -> None:
        raise self._read_only()

    def clear(self) -> None:
        raise self._read_only()


def _sqlite_engine(url: sa.URL, shown: str) -> sa.Engine:
    path = url.database or ""
    if path in ("", ":memory:"):
        raise TaskFlowStoreError(f"{shown} is an in-memory database: there is nothing to import")
    if not os.path.isfile(path):
        raise TaskFlowStoreError(f"{shown}: no such file {path!r}")
    uri = f"file:{os.path.abspath(path)}?mode=ro"

    def connect() -> sqlite3.Connection:
        # mode=ro: the file is never written, nor its journal mode changed.
        return sqlite3.connect(uri, uri=True, check_same_thread=False)

    return sa.create_engine("sqlite://", creator=connect, poolclass=sa_pool.NullPool)


def _check_tables(conn: sa.Connection, where: str) -> None:
    inspector = sa.inspect(conn)
    if inspector.has_table(SCHEMA_TABLE):
        raise TaskFlowStoreError(
            f"{where} is a flowengine store already ({SCHEMA_TABLE} is there): nothing to import;"
            " give it to flowengine as --backend (flowengine db upgrade brings its schema current)")
    missing_tables = [name for name in _COLUMNS if not inspector.has_table(name)]
    if missing_tables:
        raise TaskFlowStoreError(
            f"{where} has no {', '.join(missing_tables)} table(s): not a TaskFlow store"
            " (TaskFlow's Connection.upgrade() creates them)")
    missing = [f"{name}.{column}" for name, columns in _COLUMNS.items()
               for column in sorted(set(columns)
                                    - {str(c["name"]) for c in inspector.get_columns(name)})]
    if missing:
        raise TaskFlowStoreError(
            f"{where} lacks the column(s) {', '.join(missing)}: an older TaskFlow made it; bring"
            " it to TaskFlow 6's schema with TaskFlow first (its Connection.upgrade())")


@contextlib.contextmanager
def _sql_reading(url: str, where: str) -> Iterator[Session]:
    try:
        parsed = normalize_url(url)
    except ValueError as err:
        raise TaskFlowStoreError(str(err)) from err
    if parsed.get_backend_name() == "sqlite":
        engine = _sqlite_engine(parsed, where)
    else:
        try:
            args = ({"connect_timeout": 10} if parsed.get_backend_name() == "postgresql"
                    else {})
            engine = sa.create_engine(parsed, poolclass=sa_pool.NullPool, connect_args=args)
        except (ImportError, sa_exc.NoSuchModuleError) as err:
            hint = (" flowengine reads PostgreSQL through psycopg 3: give the URL as"
                    " postgresql://... (pip install 'flowengine[postgresql]')"
                    if parsed.get_backend_name() == "postgresql" else "")
            raise TaskFlowStoreError(
                f"{where}: the database driver is not installed ({err});{hint}") from err
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ",
                                              postgresql_readonly=True)
            with conn.begin():
                _check_tables(conn, where)
                yield _SQLReading(conn, where)
    finally:
        engine.dispose()


@contextlib.contextmanager
def opened(url: str) -> Iterator[Session]:
    """Open the TaskFlow store at ``url`` for reading.

    Args:
        url: ``sqlite:///path``, ``postgresql://...`` (psycopg 3), ``mysql://...`` (with a
            driver installed), or ``dir:///path`` / ``file:///path``: what TaskFlow's
            ``connection`` was (for a directory, its ``path`` as a URL).

    Yields:
        A read-only session: its ``books``, ``flows_of``, ``atoms_of`` and ``get_*`` return
        flowengine models; a damaged record raises
        :class:`~flowengine.persistence.base.CorruptRecord` naming it.

    Raises:
        TaskFlowStoreError: If the URL names no store TaskFlow 6.x writes, the store is
            missing, is a flowengine store, or is older than TaskFlow 6's schema.
        sqlalchemy.exc.SQLAlchemyError: If the database cannot be reached.
    """
    shown = mask_urls(url)
    try:
        scheme, conf = split_conf(url)
    except (TypeError, ValueError) as err:
        raise TaskFlowStoreError(f"{shown}: {err}") from err
    where = f"TaskFlow store '{shown}'"
    if scheme in _DIR_SCHEMES:
        try:
            session = reading_session(str(conf.get("path") or ""), where)
        except NotADirectoryError as err:
            raise TaskFlowStoreError(f"{where}: {err}") from err
        yield session
        return
    if scheme not in _SQL_SCHEMES:
        raise TaskFlowStoreError(
            f"{shown} is not the URL of a TaskFlow store flowengine reads: give sqlite:///path,"
            " postgresql://..., mysql://... or dir:///path")
    with _sql_reading(url, where) as session:
        yield session
