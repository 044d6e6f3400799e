"""The SQL schema: three record tables and the table of applied schema migrations.

Table and column names follow TaskFlow's schema, so queries operators wrote against it still read
naturally; JSON values (metadata, results, failures, versions) are stored as JSON text in ``Text``
columns on every database, never as pickles or driver-specific JSON types.

Columns flowengine adds to TaskFlow's tables are named in :data:`ADDED` with the schema version
that added them: :func:`define` leaves them out of the tables of an older version, which is what
the migration creating the tables makes (the later migrations add them).
"""

from __future__ import annotations

import datetime
from typing import NamedTuple

import sqlalchemy as sa

#: The table recording which schema migrations were applied (one row per version).
SCHEMA_TABLE = "flowengine_schema"

_UUID = 64
_NAME = 255
_STATE = 255
_KIND = 32


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


class Tables(NamedTuple):
    """The tables of one :class:`sqlalchemy.MetaData`."""

    logbooks: sa.Table
    flowdetails: sa.Table
    atomdetails: sa.Table
    schema: sa.Table


#: Columns added after the tables were first created: (table, column) -> the schema version
#: that added it. ``times``: when the flow or atom entered each state (JSON text).
ADDED: dict[tuple[str, str], int] = {
    ("flowdetails", "times"): 4,
    ("atomdetails", "times"): 4,
}


def define(metadata: sa.MetaData, version: int | None = None) -> Tables:
    """Define the tables (without the indexes migrations add) in ``metadata``: the current
    ones, or those of schema ``version`` (without the columns later versions add)."""
    logbooks = sa.Table(
        "logbooks",
        metadata,
        sa.Column("uuid", sa.String(_UUID), primary_key=True),
        sa.Column("name", sa.String(_NAME)),
        sa.Column("meta", sa.Text),
        # LogBook.created_at / updated_at: owned by the model, not stamped by the database.
        sa.Column("created_at", sa.DateTime),
        sa.Column("updated_at", sa.DateTime),
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
        sa.Column("meta", sa.Text),
        sa.Column("created_at", sa.DateTime, default=_utcnow),
        sa.Column("updated_at", sa.DateTime, default=_utcnow, onupdate=_utcnow),
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
        sa.Column("version", sa.Text),
        sa.Column("meta", sa.Text),
        sa.Column("results", sa.Text),
        sa.Column("failure", sa.Text),
        sa.Column("revert_results", sa.Text),
        sa.Column("revert_failure", sa.Text),
        sa.Column("created_at", sa.DateTime, default=_utcnow),
        sa.Column("updated_at", sa.DateTime, default=_utcnow, onupdate=_utcnow),
    )
    for table in (flowdetails, atomdetails):
        for (name, column), added in ADDED.items():
            if name == table.name and (version is None or version >= added):
                table.append_column(sa.Column(column, sa.Text))
    schema = sa.Table(
        SCHEMA_TABLE,
        metadata,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.String(_NAME), nullable=False),
        sa.Column("applied_at", sa.DateTime, nullable=False, default=_utcnow),
    )
    return Tables(logbooks, flowdetails, atomdetails, schema)


#: Record tables, in the order rows must be deleted (children first).
RECORD_TABLES = ("atomdetails", "flowdetails", "logbooks")
