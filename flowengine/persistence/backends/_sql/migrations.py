"""Schema versions and the steps from each to the next.

The database records every applied step as a row of ``flowengine_schema`` (version, description,
when). :func:`upgrade` applies the missing steps, in order, in one transaction that holds the
database's write lock, so two processes upgrading at once apply each step once. MySQL and MariaDB
commit every DDL statement on its own, so there a named lock (``GET_LOCK``) held for the whole
upgrade makes a second upgrader wait and then find the steps applied. A database whose
version is newer than :data:`LATEST` was written by a later flowengine: it is refused, never
changed.

To change the schema, append a :class:`Migration`; never edit one that was released. A column
added to an existing table is named in ``tables.ADDED`` with its version, so step 1 still creates
the tables of version 1 and the step adding it finds them without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import sqlalchemy as sa

from flowengine.persistence._hints import import_hint
from flowengine.persistence.backends._sql import tables as schema
from flowengine.persistence.base import IncompatibleSchema

# An arbitrary constant: the PostgreSQL advisory lock that serialises concurrent upgrades.
_PG_UPGRADE_LOCK = 0x666C6F77
#: MySQL's named lock for the same, and how long (seconds) an upgrade waits for it.
_MYSQL_UPGRADE_LOCK = "flowengine_schema_upgrade"
_MYSQL_LOCK_WAIT = 120


@dataclasses.dataclass(frozen=True)
class Migration:
    """One schema step.

    Attributes:
        version: The version the database has once the step is applied.
        description: What the step does (stored in ``flowengine_schema``).
        apply: Runs the step on a connection inside the upgrade transaction.
    """

    version: int
    description: str
    apply: Callable[[sa.Connection], None]


def _create_tables(conn: sa.Connection) -> None:
    tables = schema.define(sa.MetaData(), version=1)
    for table in (tables.logbooks, tables.flowdetails, tables.atomdetails):
        table.create(conn)


def _index_parents(conn: sa.Connection) -> None:
    # Loading a logbook lists its flows, and loading a flow its atoms, by parent_uuid.
    tables = schema.define(sa.MetaData())
    sa.Index("flowdetails_parent_uuid_idx", tables.flowdetails.c.parent_uuid).create(conn)
    sa.Index("atomdetails_parent_uuid_idx", tables.atomdetails.c.parent_uuid).create(conn)


def _index_updated(conn: sa.Connection) -> None:
    # Flow listings read newest first, a page at a time (keyset pagination seeks this index).
    tables = schema.define(sa.MetaData())
    sa.Index("flowdetails_updated_at_idx", tables.flowdetails.c.updated_at,
             tables.flowdetails.c.uuid).create(conn)


def _add_columns(version: int) -> Callable[[sa.Connection], None]:
    """The step adding the columns ``tables.ADDED`` says ``version`` added, typed as the
    current table definitions type them on the connection's database."""

    def apply(conn: sa.Connection) -> None:
        tables = schema.define(sa.MetaData())
        quote = conn.dialect.identifier_preparer.quote
        for (table_name, column_name), added in schema.ADDED.items():
            if added != version:
                continue
            column = getattr(tables, table_name).c[column_name]
            kind = column.type.compile(dialect=conn.dialect)
            conn.execute(sa.text(f"ALTER TABLE {quote(table_name)} ADD COLUMN"
                                 f" {quote(column_name)} {kind}"))

    return apply


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "logbooks, flowdetails and atomdetails tables", _create_tables),
    Migration(2, "indexes on flowdetails.parent_uuid and atomdetails.parent_uuid", _index_parents),
    Migration(3, "index on flowdetails (updated_at, uuid)", _index_updated),
    Migration(4, "times columns on flowdetails and atomdetails (when each state was entered)",
              _add_columns(4)),
    Migration(5, "fencing_token column on flowdetails (the newest claim that wrote the flow)",
              _add_columns(5)),
)

#: The schema version this code reads and writes.
LATEST = MIGRATIONS[-1].version


def pending(version: int) -> list[Migration]:
    """The migrations a database at schema ``version`` is missing, in the order they apply."""
    return [migration for migration in MIGRATIONS if migration.version > version]


# Columns only TaskFlow's atomdetails table has together: how its store is told from others.
_TASKFLOW_ATOM_COLUMNS = frozenset({"atom_type", "intention", "revert_results", "failure"})


def _foreign(inspector: sa.Inspector, found: list[str], where: str, url: str) -> IncompatibleSchema:
    columns = set()
    if "atomdetails" in found:
        columns = {str(column["name"]) for column in inspector.get_columns("atomdetails")}
    if _TASKFLOW_ATOM_COLUMNS <= columns or inspector.has_table("alembic_version"):
        return IncompatibleSchema(
            f"{where} holds a TaskFlow store (tables {', '.join(found)} without"
            f" {schema.SCHEMA_TABLE}), which flowengine does not use in place; {import_hint(url)}"
        )
    return IncompatibleSchema(
        f"{where}: tables {', '.join(found)} exist but {schema.SCHEMA_TABLE} does not; another"
        " program made them, and flowengine will not adopt them: use a database or PostgreSQL"
        " schema of its own"
    )


def current_version(conn: sa.Connection, where: str, url: str) -> int:
    """Return the database's schema version (0 for an empty database).

    Args:
        conn: A connection to the database.
        where: Names the backend in messages.
        url: The database URL (password masked) the commands in messages name.

    Raises:
        IncompatibleSchema: If the record tables exist without ``flowengine_schema`` (a TaskFlow
            store, or another program's tables of the same names); the message says what to run.
    """
    inspector = sa.inspect(conn)
    if not inspector.has_table(schema.SCHEMA_TABLE):
        found = [name for name in schema.RECORD_TABLES if inspector.has_table(name)]
        if found:
            raise _foreign(inspector, found, where, url)
        return 0
    table = schema.define(sa.MetaData()).schema
    return int(conn.execute(sa.select(sa.func.max(table.c.version))).scalar() or 0)


def check(conn: sa.Connection, where: str, url: str) -> int:
    """Return the schema version, raising if this code cannot use it (arguments as for
    :func:`current_version`).

    Raises:
        IncompatibleSchema: If the schema is newer than :data:`LATEST`, or foreign.
    """
    version = current_version(conn, where, url)
    if version > LATEST:
        raise IncompatibleSchema(
            f"{where}: the database schema is version {version}, newer than version {LATEST}"
            " that this flowengine understands; upgrade flowengine (the database was left as is)"
        )
    return version


def upgrade(conn: sa.Connection, where: str, url: str) -> list[Migration]:
    """Apply the missing migrations on ``conn`` (inside a write transaction, begun within
    :func:`upgrade_lock`; arguments as for :func:`current_version`).

    Returns:
        The migrations applied (none when the schema was current).

    Raises:
        IncompatibleSchema: If the schema is newer than this code, or foreign.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_UPGRADE_LOCK})
    return _apply_missing(conn, where, url)


@contextlib.contextmanager
def upgrade_lock(conn: sa.Connection, where: str) -> Iterator[None]:
    """Hold MySQL's or MariaDB's schema upgrade lock on ``conn`` (outside any transaction)
    until the upgrade's transaction has committed; on other databases, nothing (PostgreSQL's
    lock is the transaction's, taken by :func:`upgrade`; SQLite writes one at a time).

    MySQL commits each ALTER TABLE on its own, so a transaction's lock would not last; and a
    lock released before the version row commits lets the next process, which cannot see
    that row yet, apply the same migration again. So a session's named lock, released only
    after the commit.
    """
    if conn.dialect.name not in ("mysql", "mariadb"):
        yield
        return
    got = conn.execute(sa.text("SELECT GET_LOCK(:name, :wait)"),
                       {"name": _MYSQL_UPGRADE_LOCK, "wait": _MYSQL_LOCK_WAIT}).scalar()
    conn.commit()  # ends the statement's own transaction; the session keeps the lock
    if got != 1:
        raise IncompatibleSchema(f"{where}: another process held the schema upgrade lock for "
                                 f"{_MYSQL_LOCK_WAIT}s; the schema was left as it was")
    try:
        yield
    finally:
        # Released whatever happens: the pool keeps the session (and would keep the lock)
        # after the connection is given back.
        conn.execute(sa.text("SELECT RELEASE_LOCK(:name)"), {"name": _MYSQL_UPGRADE_LOCK})
        conn.commit()


def _apply_missing(conn: sa.Connection, where: str, url: str) -> list[Migration]:
    version = check(conn, where, url)
    table = schema.define(sa.MetaData()).schema
    if version == 0:
        table.create(conn)
    applied = pending(version)
    for migration in applied:
        migration.apply(conn)
        conn.execute(
            sa.insert(table).values(version=migration.version, description=migration.description)
        )
    return applied
