"""The persistence stores tests run one behaviour on: memory, dir, SQLite, PostgreSQL and
MariaDB (the cluster suite's server, marked ``cluster``), each fresh for its test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: The kinds of store, by name.
NAMES = ("memory", "dir", "sqlite", "postgresql", "mariadb")


def params(*before: Any) -> list[Any]:
    """One ``pytest.param`` per kind of store (``before`` ahead of its name), MariaDB's marked
    ``cluster``."""
    return [pytest.param(*before, name, marks=[pytest.mark.cluster] if name == "mariadb" else [],
                         id="-".join([*map(str, before), name])) for name in NAMES]


#: Every kind of store, for ``pytest.mark.parametrize``.
KINDS = params()


def store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a fresh store of ``kind`` (one of :data:`NAMES`)."""
    if kind == "memory":
        return "memory://"
    if kind == "dir":
        return f"dir://{tmp_path}/records"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/records.db"
    fixture = "mariadb_database_url" if kind == "mariadb" else "postgres_schema_url"
    return str(request.getfixturevalue(fixture))
