"""The SQL schema: three record tables and the table of applied schema migrations.

Table and column names follow TaskFlow's schema, so queries operators wrote against it still read
naturally; JSON values (metadata, results, failures, versions) are stored as JSON text in ``Text``
columns on every database, never as pickles or driver-specific JSON types. On MySQL and MariaDB,
whose ``TEXT`` holds 64 KiB and whose ``DATETIME`` keeps whole seconds, those columns are
``LONGTEXT`` (a result of megabytes fits) and ``DATETIME(6)`` (microseconds, as elsewhere: the
flow listing's keyset pages order by them), and the tables are InnoDB in ``utf8mb4``.

Columns flowengine adds to TaskFlow's tables are named in :data:`ADDED` with the schema version
that added them: :func:`define` leaves them out of the tables of an older version, which is what
the migration creating the tables makes (the later migrations add them).
"""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

#: The table recording which schema migrations were applied (one row per version).
SCHEMA_TABLE = "flowengine_schema"

_UUID = 64
_NAME = 255
_STATE = 255
_KIND = 32


#: JSON text, and a timestamp with microseconds, on every database.
_JSON = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
_TIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: MySQL's table options (other databases ignore them).
_MYSQL: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


class Tables(NamedTuple):
    """The tables of one :class:`sqlalchemy.MetaData`."""

    logbooks: sa.Table
    flowdetails: sa.Table
    atomdetails: sa.Table
    schema: sa.Table


#: Columns added after the tables were first created: (table, column) -> the schema version
#: that added it. ``times``: when the flow or atom entered each state (JSON text);
#: ``fencing_token``: the greatest claim token a write to the flow was made under (see
#: :mod:`flowengine.persistence.fencing`).
ADDED: dict[tuple[str, str], int] = {
    ("flowdetails", "times"): 4,
    ("atomdetails", "times"): 4,
    ("flowdetails", "fencing_token"): 5,
}
#: The type of each added column that is not JSON text.
_ADDED_TYPES: dict[tuple[str, str], sa.types.TypeEngine[Any]] = {
    ("flowdetails", "fencing_token"): sa.BigInteger(),
}


def define(metadata: sa.MetaData, version: int | None = None) -> Tables:
    """Define the tables (without the indexes migrations add) in ``metadata``: the current
    ones, or those of schema ``version`` (without the columns later versions add)."""
    logbooks = sa.Table(
        "logbooks",
        metadata,
        sa.Column("uuid", sa.String(_UUID), primary_key=True),
        sa.Column("name", sa.String(_NAME)),
        sa.Column("meta", _JSON),
        # LogBook.created_at / updated_at: owned by the model, not stamped by the database.
        sa.Column("created_at", _TIME),
        sa.Column("updated_at", _TIME),
        **_MYSQL,
    )
    flowdetails = sa.Table(
        "flowdetails",
        metadata,
        sa.Column("uuid", sa.String(_UUID), primary_key=True),
        sa.Column(
            "parent_uuid", sa.String(_UUID), sa.ForeignKey("logbooks.uuid", ondelete="CASCADE")
        ),
        sa.Column("name", sa.String(_NAME)),
        sa.Column("state", sa.String(_STATE)),
        sa.Column("meta", _JSON),
        sa.Column("created_at", _TIME, default=_utcnow),
        sa.Column("updated_at", _TIME, default=_utcnow, onupdate=_utcnow),
        **_MYSQL,
    )
    atomdetails = sa.Table(
        "atomdetails",
        metadata,
        sa.Column("uuid", sa.String(_UUID), primary_key=True),
        sa.Column(
            "parent_uuid", sa.String(_UUID), sa.ForeignKey("flowdetails.uuid", ondelete="CASCADE")
        ),
        sa.Column("name", sa.String(_NAME)),
        sa.Column("atom_type", sa.String(_KIND)),
        sa.Column("state", sa.String(_STATE)),
        sa.Column("intention", sa.String(_KIND)),
        sa.Column("version", _JSON),
        sa.Column("meta", _JSON),
        sa.Column("results", _JSON),
        sa.Column("failure", _JSON),
        sa.Column("revert_results", _JSON),
        sa.Column("revert_failure", _JSON),
        sa.Column("created_at", _TIME, default=_utcnow),
        sa.Column("updated_at", _TIME, default=_utcnow, onupdate=_utcnow),
        **_MYSQL,
    )
    for table in (flowdetails, atomdetails):
        for (name, column), added in ADDED.items():
            if name == table.name and (version is None or version >= added):
                table.append_column(sa.Column(column, _ADDED_TYPES.get((name, column), _JSON)))
    schema = sa.Table(
        SCHEMA_TABLE,
        metadata,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.String(_NAME), nullable=False),
        sa.Column("applied_at", _TIME, nullable=False, default=_utcnow),
        **_MYSQL,
    )
    return Tables(logbooks, flowdetails, atomdetails, schema)


#: Record tables, in the order rows must be deleted (children first).
RECORD_TABLES = ("atomdetails", "flowdetails", "logbooks")
