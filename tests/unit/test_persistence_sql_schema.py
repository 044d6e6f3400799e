"""The SQL backend's versioned schema: creation, upgrade from an older version, refusals."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from flowengine import exceptions as exc
from flowengine.persistence import backends, models
from flowengine.persistence.backends._sql import migrations, tables
from flowengine.persistence.backends._sql.engine import normalize_url
from flowengine.persistence.base import IncompatibleSchema


@pytest.fixture(params=["sqlite", "postgresql", pytest.param("mariadb", marks=pytest.mark.cluster)])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/schema.db"
    if request.param == "mariadb":
        return str(request.getfixturevalue("mariadb_database_url"))
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


@pytest.fixture
def raw(sql_url: str) -> Iterator[sa.Engine]:
    """A plain engine on the same database, to shape the schema by hand."""
    engine = sa.create_engine(normalize_url(sql_url))
    yield engine
    engine.dispose()


def _versions(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT version FROM flowengine_schema ORDER BY version"))
        return [row[0] for row in rows]


def _indexes(engine: sa.Engine) -> set[str]:
    inspector = sa.inspect(engine)
    return {
        str(ix["name"])
        for table in ("flowdetails", "atomdetails")
        for ix in inspector.get_indexes(table)
    }


def _apply_v1(engine: sa.Engine) -> None:
    """Leave the database as a release that knew only schema version 1 would have."""
    with engine.begin() as conn:
        table = tables.define(sa.MetaData()).schema
        table.create(conn)
        first = migrations.MIGRATIONS[0]
        first.apply(conn)
        conn.execute(sa.insert(table).values(version=1, description=first.description))


def test_upgrade_creates_the_latest_schema(sql_url: str, raw: sa.Engine) -> None:
    with backends.backend(sql_url):
        pass
    assert _versions(raw) == [m.version for m in migrations.MIGRATIONS]
    assert {"flowdetails_parent_uuid_idx", "atomdetails_parent_uuid_idx",
            "flowdetails_updated_at_idx"} <= _indexes(raw)


def test_upgrade_brings_a_version_1_schema_forward_keeping_records(
    sql_url: str, raw: sa.Engine
) -> None:
    _apply_v1(raw)
    with raw.begin() as conn:
        conn.execute(sa.text("INSERT INTO logbooks (uuid, name, meta) VALUES ('b1', 'old', '{}')"))
        conn.execute(
            sa.text(
                "INSERT INTO flowdetails (uuid, parent_uuid, name, state, meta)"
                " VALUES ('f1', 'b1', 'flow', 'SUCCESS', '{\"k\": 1}')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO atomdetails (uuid, parent_uuid, name, atom_type, state, intention,"
                " results) VALUES ('a1', 'f1', 'task', 'TASK_DETAIL', 'SUCCESS', 'EXECUTE', '42')"
            )
        )
    be = backends.fetch(sql_url)
    try:
        store = be.get_connection()  # an older schema can be connected to, to upgrade it
        with pytest.raises(exc.StorageFailure, match=r"version 1.*flowengine db upgrade"):
            store.get_logbook("b1")
        store.upgrade()
        book = store.get_logbook("b1")
        (flow,) = list(book)
        atom = flow.find("a1")
        assert atom is not None
        assert (flow.state, flow.meta, atom.results) == ("SUCCESS", {"k": 1}, 42)
    finally:
        be.close()
    assert _versions(raw) == [m.version for m in migrations.MIGRATIONS]
    assert {"atomdetails_parent_uuid_idx", "flowdetails_updated_at_idx"} <= _indexes(raw)


def test_a_newer_schema_is_refused_and_left_alone(sql_url: str, raw: sa.Engine) -> None:
    with backends.backend(sql_url) as be:
        with contextlib.closing(be.get_connection()) as conn:
            conn.save_logbook(models.LogBook("kept", uuid="kept"))
    with raw.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO flowengine_schema (version, description, applied_at)"
                " VALUES (99, 'from the future', CURRENT_TIMESTAMP)"
            )
        )
    be = backends.fetch(sql_url)
    try:
        conn = be.get_connection()  # reachable: the schema is checked where it is used
        for use in (conn.validate, lambda: list(conn.get_logbooks()), conn.upgrade):
            with pytest.raises(IncompatibleSchema) as caught:
                use()
            message = str(caught.value)
            assert "version 99" in message and "sqlalchemy backend" in message
            assert "upgrade flowengine" in message and "\n" not in message
            assert isinstance(caught.value, exc.StorageFailure)
            assert isinstance(caught.value, exc.IncompatibleVersion)
        with pytest.raises(IncompatibleSchema):
            with backends.backend(sql_url):
                pass
    finally:
        be.close()
    assert _versions(raw)[-1] == 99
    with raw.connect() as conn:
        assert conn.execute(sa.text("SELECT name FROM logbooks")).scalar() == "kept"


def test_foreign_tables_are_not_adopted(sql_url: str, raw: sa.Engine) -> None:
    with raw.begin() as conn:
        conn.execute(sa.text("CREATE TABLE logbooks (uuid VARCHAR(64) PRIMARY KEY, x TEXT)"))
    with pytest.raises(IncompatibleSchema, match="logbooks"):
        with backends.backend(sql_url):
            pass
    assert not sa.inspect(raw).has_table("flowengine_schema")


def test_using_a_database_never_upgraded_says_what_to_do(sql_url: str) -> None:
    be = backends.fetch(sql_url)
    try:
        with pytest.raises(exc.StorageFailure,
                           match=r"no flowengine schema.*flowengine db upgrade --backend"):
            be.get_connection().save_logbook(models.LogBook("b"))
    finally:
        be.close()


def test_two_backends_upgrading_at_once_apply_each_step_once(sql_url: str, raw: sa.Engine) -> None:

    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def upgrade() -> None:
        try:
            be = backends.fetch(sql_url)
            start.wait()
            be.get_connection().upgrade()
            be.close()
        except BaseException as err:  # reported by the test thread
            errors.append(err)

    threads = [threading.Thread(target=upgrade) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _versions(raw) == [m.version for m in migrations.MIGRATIONS]
