"""``flowengine db import-taskflow``: running it again, damaged records, and wrong stores.

The TaskFlow stores here are written by TaskFlow's own persistence API (``taskflow`` is
installed for the tests); ``tests/integration/test_taskflow_import.py`` fills them with real
TaskFlow engines and resumes a flow in flight from the copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from taskflow import states as tf_states
from taskflow.persistence import backends as tf_backends
from taskflow.persistence import models as tf_models
from taskflow.types import failure as tf_failure

from flowengine.cli import exits
from flowengine.cli.main import cli
from flowengine.persistence import backends, models, taskflow_import
from flowengine.persistence.taskflow_store import TaskFlowStoreError
from flowengine.types.failure import Failure


def invoke(*args: str) -> Result:
    env: dict[str, str | None] = {key: None for key in os.environ
                                  if key.startswith("FLOWENGINE_")}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


@contextlib.contextmanager
def taskflow_connection(url: str) -> Iterator[tf_backends.base.Connection]:
    conf = ({"connection": "dir", "path": url[len("dir://"):]} if url.startswith("dir://")
            else {"connection": url})
    backend = tf_backends.fetch(conf)
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
            yield conn
    finally:
        backend.close()


def failure_of(err: Exception) -> tf_failure.Failure:
    try:
        raise err
    except Exception:
        return tf_failure.Failure()


def taskflow_flow(book: tf_models.LogBook, uuid: str, state: str) -> tf_models.FlowDetail:
    """A flow detail as a TaskFlow engine leaves it: a task done, one failed, one running."""
    fd = tf_models.FlowDetail("order", uuid)
    fd.state = state
    fd.meta = {"factory": {"name": "shop.make_order", "args": [], "kwargs": {}}}
    done = tf_models.TaskDetail("reserve", f"{uuid}-reserve")
    done.state, done.results, done.version = tf_states.SUCCESS, {"id": 7}, "1.0"
    done.meta = {"progress": 1.0}
    failed = tf_models.TaskDetail("charge", f"{uuid}-charge")
    failed.state, failed.intention = tf_states.REVERTED, tf_states.REVERT
    failed.failure = failure_of(ValueError("card declined"))
    running = tf_models.TaskDetail("pack", f"{uuid}-pack")
    running.state = tf_states.RUNNING
    for ad in (done, failed, running):
        fd.add(ad)
    book.add(fd)
    return fd


@pytest.fixture(params=["sqlite", "dir"])
def source(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    """A TaskFlow store holding logbook ``book`` with flows ``f1`` (RUNNING), ``f2`` (SUCCESS)."""
    url = (f"sqlite:///{tmp_path}/taskflow.db" if request.param == "sqlite"
           else f"dir://{tmp_path}/taskflow")
    with taskflow_connection(url) as conn:
        book = tf_models.LogBook("shop", uuid="book")
        taskflow_flow(book, "f1", tf_states.RUNNING)
        taskflow_flow(book, "f2", tf_states.SUCCESS)
        conn.save_logbook(book)
    return url


@pytest.fixture
def target(tmp_path: pathlib.Path) -> str:
    return f"sqlite:///{tmp_path}/flowengine.db"


def fingerprint(url: str) -> str:
    if url.startswith("sqlite:///"):
        return hashlib.sha256(pathlib.Path(url[len("sqlite:///"):]).read_bytes()).hexdigest()
    root = pathlib.Path(url[len("dir://"):])
    return "\n".join(str(p.relative_to(root)) + (
        hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink()
        else "") for p in sorted(root.rglob("*")))


def run_import(source: str, target: str) -> dict[str, object]:
    result = invoke("db", "import-taskflow", "--from", source, "--backend", target, "--json")
    assert result.exit_code == exits.OK, result.output
    report: dict[str, object] = json.loads(result.stdout)
    return report


def outcomes(report: dict[str, object]) -> dict[str, str]:
    flows = report["flows"]
    assert isinstance(flows, list)
    return {flow["uuid"]: flow["outcome"] for flow in flows}


def test_records_come_over_and_the_taskflow_store_is_only_read(source: str, target: str) -> None:
    before = fingerprint(source)
    report = run_import(source, target)
    assert outcomes(report) == {"f1": "imported", "f2": "imported"}
    assert [f["uuid"] for f in report["flows"] if f["in_flight"]] == ["f1"]  # type: ignore
    assert fingerprint(source) == before  # nothing written, not even a lock file
    with backends.backend(target) as be:
        fd = be.get_connection().get_flow_details("f1")
    atoms = {ad.name: ad for ad in fd}
    assert (fd.state, fd.meta["factory"]["name"]) == ("RUNNING", "shop.make_order")
    assert (atoms["reserve"].results, atoms["reserve"].meta) == ({"id": 7}, {"progress": 1.0})
    assert atoms["reserve"].version == "1.0"
    charge = atoms["charge"]
    assert (charge.state, charge.intention) == ("REVERTED", "REVERT")
    assert isinstance(charge.failure, Failure) and charge.failure.check(ValueError)
    assert charge.failure.exception_str == "card declined"
    assert atoms["pack"].state == "RUNNING"
    mark = fd.meta[taskflow_import.MARK]
    assert mark["from"].startswith("TaskFlow store ") and len(mark["digest"]) == 64


def test_running_again_refreshes_only_what_flowengine_has_not_touched(
    source: str, target: str
) -> None:
    run_import(source, target)
    # TaskFlow moves both flows on (an engine was still running: the import came too early).
    with taskflow_connection(source) as conn:
        for uuid in ("f1", "f2"):
            fd = conn.get_flow_details(uuid)
            fd.meta["note"] = "moved on"
            conn.update_flow_details(fd)
    # ... and flowengine has resumed f2 from the first copy meanwhile.
    with backends.backend(target) as be:
        conn = be.get_connection()
        resumed = conn.get_flow_details("f2")
        resumed.state = "SUCCESS"
        resumed.meta["resumed-by"] = "flowengine"
        conn.update_flow_details(resumed)
    report = run_import(source, target)
    assert outcomes(report) == {"f1": "refreshed", "f2": "kept"}
    kept = [f for f in report["flows"] if f["outcome"] == "kept"]  # type: ignore
    assert "flowengine has changed it since it was copied" in kept[0]["reason"]
    with backends.backend(target) as be:
        conn = be.get_connection()
        assert conn.get_flow_details("f1").meta["note"] == "moved on"
        assert "note" not in conn.get_flow_details("f2").meta
        assert conn.get_flow_details("f2").meta["resumed-by"] == "flowengine"
    assert outcomes(run_import(source, target)) == {"f1": "unchanged", "f2": "kept"}


def test_a_flow_of_the_same_uuid_not_from_taskflow_is_kept(source: str, target: str) -> None:
    with backends.backend(target) as be:
        book = models.LogBook("mine", uuid="book")
        book.add(models.FlowDetail("mine", "f1"))
        be.get_connection().save_logbook(book)
    report = run_import(source, target)
    assert outcomes(report) == {"f1": "kept", "f2": "imported"}
    with backends.backend(target) as be:
        assert be.get_connection().get_flow_details("f1").name == "mine"


def test_a_damaged_flow_is_refused_and_named_the_others_are_copied(
    tmp_path: pathlib.Path, target: str
) -> None:
    url = f"sqlite:///{tmp_path}/taskflow.db"
    with taskflow_connection(url) as conn:
        book = tf_models.LogBook("shop", uuid="book")
        taskflow_flow(book, "f1", tf_states.RUNNING)
        taskflow_flow(book, "f2", tf_states.RUNNING)
        conn.save_logbook(book)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE atomdetails SET results = '{not json' WHERE uuid = 'f2-pack'"))
    engine.dispose()
    result = invoke("db", "import-taskflow", "--from", url, "--backend", target)
    assert result.exit_code == exits.ERROR, result.output
    assert "2 flow(s): 1 imported, 1 refused" in result.stdout
    assert "refused f2 order: TaskFlow store" in result.stdout
    assert "atom detail 'f2-pack' is damaged" in result.stdout
    with backends.backend(target) as be:
        conn = be.get_connection()
        assert len(conn.get_flow_details("f1")) == 3
        with pytest.raises(Exception, match="f2"):
            conn.get_flow_details("f2")


def test_stores_that_are_not_taskflow_stores_are_refused_in_one_line(
    tmp_path: pathlib.Path, target: str
) -> None:
    with backends.backend(target):
        pass
    older = f"sqlite:///{tmp_path}/older.db"
    engine = sa.create_engine(older)
    with engine.begin() as conn:
        for table in ("logbooks", "flowdetails", "atomdetails"):
            conn.execute(sa.text(f"CREATE TABLE {table} (uuid VARCHAR(64) PRIMARY KEY)"))
    engine.dispose()
    cases = {
        target: "is a flowengine store already",
        older: "lacks the column(s) logbooks.created_at",
        f"sqlite:///{tmp_path}/absent.db": "no such file",
        f"dir://{tmp_path}/absent": "no such directory",
        "redis://127.0.0.1:6379": "is not the URL of a TaskFlow store",
    }
    other = f"sqlite:///{tmp_path}/other.db"
    for url, wanted in cases.items():
        result = invoke("db", "import-taskflow", "--from", url, "--backend", other)
        assert result.exit_code == exits.ERROR, (url, result.output)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert wanted in result.stderr, (url, result.stderr)
    assert not (tmp_path / "absent.db").exists()
    assert not (tmp_path / "other.db").exists()  # the target is not touched either
    with pytest.raises(TaskFlowStoreError):
        taskflow_import.import_taskflow(older, backends.fetch(other))


def test_the_target_cannot_be_the_taskflow_store_itself(source: str) -> None:
    same = invoke("db", "import-taskflow", "--from", source, "--backend", source)
    assert same.exit_code == exits.USAGE and "must be another database" in same.output
    if source.startswith("sqlite"):
        # Spelled differently, the same database: its TaskFlow tables refuse it.
        other_spelling = source.replace("sqlite:///", "sqlite:///./../../..", 1)
        refused = invoke("db", "import-taskflow", "--from", source, "--backend", other_spelling)
        assert refused.exit_code == exits.ERROR
        assert "holds a TaskFlow store" in refused.stderr
