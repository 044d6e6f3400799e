"""``flowengine db status`` / ``db upgrade``, and the one-line refusals of stores that need them.

A store an older flowengine made, a TaskFlow database and a schema from a later flowengine are
each refused by every command that reads flows, in one line that names the command to run,
without a traceback; ``db upgrade`` brings an old store forward keeping its records, says what
it did, and does nothing the second time.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shlex
import subprocess
import sys
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
import timed_stores  # tests/unit is on sys.path
from click.testing import CliRunner, Result
from taskflow.persistence import backends as tf_backends
from taskflow.persistence import models as tf_models

from flowengine.cli import exits
from flowengine.cli.main import cli
from flowengine.persistence import backends, models
from flowengine.persistence.backends._sql import migrations, tables
from flowengine.persistence.backends._sql.engine import normalize_url

REPO = pathlib.Path(__file__).resolve().parents[2]


def invoke(*args: str) -> Result:
    env: dict[str, str | None] = {key: None for key in os.environ
                                  if key.startswith("FLOWENGINE_")}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def command(*args: str) -> subprocess.CompletedProcess[str]:
    """The real ``flowengine`` command, as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWENGINE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "flowengine.cli.main", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(params=["sqlite", "postgresql", "dir"])
def store_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_schema_url")
        return url
    if request.param == "dir":
        return f"dir://{tmp_path}/flows"
    return f"sqlite:///{tmp_path}/flows.db"


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_schema_url")
        return url
    return f"sqlite:///{tmp_path}/flows.db"


@contextlib.contextmanager
def raw(url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(normalize_url(url))
    try:
        yield engine
    finally:
        engine.dispose()


def make_version_1(url: str) -> None:
    """The database a flowengine that knew only schema version 1 left, with one flow in it."""
    with raw(url) as engine, engine.begin() as conn:
        table = tables.define(sa.MetaData()).schema
        table.create(conn)
        first = migrations.MIGRATIONS[0]
        first.apply(conn)
        conn.execute(sa.insert(table).values(version=1, description=first.description))
        conn.execute(sa.text("INSERT INTO logbooks (uuid, name, meta) VALUES ('b1', 'old', '{}')"))
        conn.execute(sa.text("INSERT INTO flowdetails (uuid, parent_uuid, name, state, meta)"
                             " VALUES ('f1', 'b1', 'nightly', 'SUCCESS', '{}')"))
        conn.execute(sa.text("INSERT INTO atomdetails (uuid, parent_uuid, name, atom_type, state,"
                             " intention, results) VALUES ('a1', 'f1', 'step', 'TASK_DETAIL',"
                             " 'SUCCESS', 'EXECUTE', '42')"))


def make_taskflow_store(url: str) -> None:
    """A database TaskFlow's own backend created and wrote a logbook to."""
    backend = tf_backends.fetch({"connection": url.replace("postgresql://",
                                                            "postgresql+psycopg://", 1)})
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
            book = tf_models.LogBook("taskflow-book")
            book.add(tf_models.FlowDetail("f", "tf-flow"))
            conn.save_logbook(book)
    finally:
        backend.close()


def assert_one_line(result: Result | subprocess.CompletedProcess[str], *wanted: str) -> str:
    """The command failed (exit code 1) with one line on stderr holding ``wanted``.

    ``invoke`` runs with ``catch_exceptions=False``: an exception that escapes (a traceback for
    a user) fails the test there.
    """
    code = result.exit_code if isinstance(result, Result) else result.returncode
    assert code == exits.ERROR, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for text in wanted:
        assert text in lines[0], lines[0]
    return lines[0]


def test_upgrade_creates_a_store_says_what_it_did_and_is_idempotent(store_url: str) -> None:
    first = invoke("db", "upgrade", "--backend", store_url)
    assert first.exit_code == exits.OK, first.output
    applied = [line for line in first.stdout.splitlines() if ": applied " in line]
    if store_url.startswith("dir://"):
        assert len(applied) == 1 and "create the folders books, flow_details, atom_details" \
            in applied[0]
    else:
        assert [line.split(": applied ")[1] for line in applied] == [
            f"schema version {m.version}: {m.description}" for m in migrations.MIGRATIONS]
        assert f"current (schema version {migrations.LATEST})" in first.stdout
    second = invoke("db", "upgrade", "--backend", store_url)
    assert second.exit_code == exits.OK
    assert "already current" in second.stdout and "nothing to do" in second.stdout
    status = invoke("db", "status", "--backend", store_url, "--json")
    assert status.exit_code == exits.OK, status.output
    assert json.loads(status.stdout)["current"] is True


def test_an_old_flowengine_store_is_refused_in_one_line_until_db_upgrade(sql_url: str) -> None:
    make_version_1(sql_url)
    assert_one_line(command("flows", "--backend", sql_url), "schema version 1")
    for args in (["flows"], ["show", "f1"]):
        assert_one_line(invoke(*args, "--backend", sql_url), "schema version 1",
                        f"run: flowengine db upgrade --backend {shlex.quote(sql_url)}")
    status = invoke("db", "status", "--backend", sql_url)
    assert status.exit_code == exits.ERROR
    assert f"schema version 1 (this flowengine uses {migrations.LATEST})" in status.stdout
    assert "to apply: schema version 2: indexes on flowdetails.parent_uuid" in status.stdout
    assert f"run: flowengine db upgrade --backend {shlex.quote(sql_url)}" in status.stdout

    upgraded = invoke("db", "upgrade", "--backend", sql_url)
    assert upgraded.exit_code == exits.OK, upgraded.output
    assert [line.split(": applied ")[1] for line in upgraded.stdout.splitlines()
            if ": applied " in line] == [f"schema version {m.version}: {m.description}"
                                          for m in migrations.MIGRATIONS[1:]]
    shown = invoke("show", "f1", "--backend", sql_url, "--json")
    assert shown.exit_code == exits.OK, shown.output
    atoms = json.loads(shown.stdout)["atoms"]
    assert [(a["name"], a["state"], a["result"]) for a in atoms] == [("step", "SUCCESS", 42)]


def make_version_3(url: str) -> None:
    """The database a flowengine whose schema stopped at version 3 left: one flow whose times
    its engines wrote into meta, under '<STATE>-timestamp'."""
    with raw(url) as engine, engine.begin() as conn:
        table = tables.define(sa.MetaData()).schema
        table.create(conn)
        for migration in migrations.MIGRATIONS[:3]:
            migration.apply(conn)
            conn.execute(sa.insert(table).values(version=migration.version,
                                                 description=migration.description))
        old = tables.define(sa.MetaData(), version=3)
        assert "times" not in old.atomdetails.c and "times" not in old.flowdetails.c
        conn.execute(sa.insert(old.logbooks).values(uuid="old-book", name="old", meta="{}"))
        conn.execute(sa.insert(old.flowdetails).values(
            uuid="old-flow", parent_uuid="old-book", name="nightly", state="SUCCESS",
            meta=json.dumps(timed_stores.OLD_FLOW_META)))
        for name, meta in timed_stores.OLD_ATOMS.items():
            conn.execute(sa.insert(old.atomdetails).values(
                uuid=f"old-{name}", parent_uuid="old-flow", name=name, atom_type="TASK_DETAIL",
                state="SUCCESS", intention="EXECUTE", version='"1.0"', results=json.dumps(name),
                meta=json.dumps(meta)))


def test_an_upgraded_store_keeps_its_times_and_stores_new_ones_apart(sql_url: str) -> None:
    make_version_3(sql_url)
    status = invoke("db", "status", "--backend", sql_url)
    assert status.exit_code == exits.ERROR
    assert "to apply: schema version 4: times columns" in status.stdout
    upgraded = invoke("db", "upgrade", "--backend", sql_url)
    assert upgraded.exit_code == exits.OK, upgraded.output
    assert "applied schema version 4: times columns" in upgraded.stdout
    shown = json.loads(invoke("show", "old-flow", "--json", "--backend", sql_url).stdout)
    timed_stores.assert_old_timings(shown["atoms"], shown["flow"])
    [listed] = map(json.loads, invoke("flows", "--json", "--backend", sql_url).stdout.splitlines())
    assert listed["updated_at"] == shown["flow"]["updated_at"]
    # The old rows stay as they were; new state changes fill the new columns, never meta.
    store = timed_stores.TimedStore("sql", sql_url)
    try:
        flow_uuid = store.run("serial")
    finally:
        store.backend.close()
    with raw(sql_url) as engine, engine.connect() as conn:
        rows = {row.name: row for row in conn.execute(
            sa.text("SELECT name, meta, times FROM atomdetails"))}
    assert rows["first"].times is None
    assert json.loads(rows["first"].meta) == timed_stores.OLD_ATOMS["first"]
    for name in timed_stores.ORDER:
        assert json.loads(rows[name].meta) == {"progress": 1.0}
        assert set(json.loads(rows[name].times)) == {"RUNNING", "SUCCESS"}
    new = json.loads(invoke("show", flow_uuid, "--json", "--backend", sql_url).stdout)
    assert all(atom["started_at"] and atom["duration"] is not None for atom in new["atoms"])


def test_a_taskflow_database_is_refused_in_one_line_naming_the_import(sql_url: str) -> None:
    make_taskflow_store(sql_url)
    with raw(sql_url) as engine:
        before = sorted(sa.inspect(engine).get_table_names())
    hint = f"flowengine db import-taskflow --from {shlex.quote(sql_url)} --backend NEW_URL"
    assert_one_line(command("flows", "--backend", sql_url), hint)
    for args in (["flows"], ["show", "tf-flow"], ["db", "status"], ["db", "upgrade"],
                 ["run", "--resume", "tf-flow"]):
        line = assert_one_line(invoke(*args, "--backend", sql_url), "holds a TaskFlow store",
                               hint)
        assert "flowengine_schema" in line
    with raw(sql_url) as engine:
        assert sorted(sa.inspect(engine).get_table_names()) == before  # left as it was


def test_a_schema_from_a_later_flowengine_is_refused_in_one_line(sql_url: str) -> None:
    with backends.backend(sql_url) as be:
        be.get_connection().save_logbook(models.LogBook("kept"))
    with raw(sql_url) as engine, engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO flowengine_schema (version, description, applied_at)"
                             " VALUES (99, 'from the future', CURRENT_TIMESTAMP)"))
    for args in (["flows"], ["db", "upgrade"], ["db", "status"]):
        assert_one_line(invoke(*args, "--backend", sql_url), "version 99",
                        "upgrade flowengine")


def test_status_of_a_store_that_does_not_exist_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    result = invoke("db", "status", "--backend", f"sqlite:///{tmp_path}/absent.db")
    assert result.exit_code == exits.USAGE
    assert "absent.db does not exist" in result.output
    assert not (tmp_path / "absent.db").exists()


def test_a_dir_store_missing_its_folders_needs_an_upgrade(tmp_path: pathlib.Path) -> None:
    (tmp_path / "flows" / "books").mkdir(parents=True)
    status = invoke("db", "status", "--backend", f"dir://{tmp_path}/flows")
    assert status.exit_code == exits.ERROR
    assert "to apply: create the folders flow_details, atom_details" in status.stdout
    upgraded = invoke("db", "upgrade", "--backend", f"dir://{tmp_path}/flows")
    assert upgraded.exit_code == exits.OK
    assert {p.name for p in (tmp_path / "flows").iterdir()} >= {"books", "flow_details",
                                                                "atom_details"}
