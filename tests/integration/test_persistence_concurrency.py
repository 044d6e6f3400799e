"""Processes sharing one store: two writing flows into one logbook at the same time lose nothing,
a third reading meanwhile never sees half of a save, two engines running real flows leave every
record intact, and a lock another process or transaction keeps fails a save by name instead of
blocking it forever."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import backends, base, models

pytestmark = pytest.mark.integration

WRITER = Path(__file__).with_name("_persistence_writer.py")
FLOWS_PER_WRITER = 20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["dir", "sqlite", "postgresql"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "dir":
        return f"dir://{tmp_path}/records"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/records.db"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


def _spawn(*args: str) -> subprocess.Popen[str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(WRITER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )


def _start(uri: str, book_uuid: str, name: str, *extra: str) -> subprocess.Popen[str]:
    return _spawn(uri, book_uuid, name, str(FLOWS_PER_WRITER), *extra)


def _shared_book(uri: str) -> models.LogBook:
    with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
        book = models.LogBook("shared")
        conn.save_logbook(book)
    return book


def _run_together(procs: dict[str, subprocess.Popen[str]]) -> None:
    """Wait until every process is ready, start them all at once, and check they all end well."""
    try:
        for proc in procs.values():
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"  # all connected: start together
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{name} failed:\n{err}"
            assert out.startswith("done")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _stored_book(uri: str, book_uuid: str) -> models.LogBook:
    with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
        return conn.get_logbook(book_uuid)


def test_two_processes_share_one_store(uri: str) -> None:
    book = _shared_book(uri)
    writers = ("alpha", "beta")
    procs = {name: _start(uri, book.uuid, name) for name in writers}
    procs["reader"] = _start(uri, book.uuid, "reader", str(len(writers)))
    _run_together(procs)

    stored = _stored_book(uri, book.uuid)
    expected = {f"{w}-flow-{i}" for w in writers for i in range(FLOWS_PER_WRITER)}
    assert {fd.uuid for fd in stored} == expected
    for fd in stored:
        writer, _, index = fd.name.partition("-")
        assert fd.state == states.SUCCESS
        assert {ad.name: ad.results for ad in fd} == {
            f"t{n}": {"writer": writer, "flow": int(index), "task": f"t{n}"} for n in range(3)
        }


ENGINE_FLOWS = 6


def test_two_processes_run_flows_through_engines_on_one_store(uri: str) -> None:
    book = _shared_book(uri)
    runners = ("left", "right")
    _run_together({name: _spawn("--engines", uri, book.uuid, name, str(ENGINE_FLOWS))
                   for name in runners})

    stored = _stored_book(uri, book.uuid)
    by_name = {fd.name: fd for fd in stored}
    assert sorted(by_name) == sorted(f"{r}-{i}" for r in runners for i in range(ENGINE_FLOWS))
    tasks = [f"t{n}" for n in range(4)]
    for name, fd in by_name.items():
        runner, _, index = name.partition("-")
        assert fd.state == states.SUCCESS, f"{name}: {fd.state}"
        atoms = {ad.name: ad for ad in fd}
        assert sorted(atoms) == sorted([*tasks, "_TaskFlow_INJECTOR"]), name
        for n, task_name in enumerate(tasks):
            ad = atoms[task_name]
            assert (ad.state, ad.intention) == (states.SUCCESS, states.EXECUTE), name
            assert ad.results == [runner, index, *tasks[:n + 1]], name


# ---- locks kept by someone else ---------------------------------------------------------------


@contextlib.contextmanager
def _lock_held_by_another_process(path: Path) -> Iterator[None]:
    holder = _spawn("--hold-lock", str(path), "20")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        yield
    finally:
        holder.communicate("release\n", timeout=30)


def test_dir_lock_held_by_another_process_fails_by_name(tmp_path: Path) -> None:
    root = tmp_path / "records"
    with backends.backend({"connection": f"dir://{root}", "lock_timeout": 0.3}) as be:
        conn = be.get_connection()
        kept = models.LogBook("kept")
        conn.save_logbook(kept)
        book = models.LogBook("blocked")
        with _lock_held_by_another_process(root / ".flowengine-lock"):
            with pytest.raises(exc.BackendError) as caught:
                conn.save_logbook(book)
            with pytest.raises(exc.BackendError, match=kept.uuid):
                conn.get_logbook(kept.uuid)
        message = str(caught.value)
        assert str(root) in message and book.uuid in message, message
        assert ".flowengine-lock" in message and "lock_timeout" in message, message
        conn.save_logbook(book)  # the lock is free again
        assert {b.uuid for b in conn.get_logbooks()} == {kept.uuid, book.uuid}


def test_dir_lock_timeout_is_checked() -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        backends.fetch({"connection": "dir:///tmp/x", "lock_timeout": "-1"})


def _saved_task(conn: base.Connection) -> models.TaskDetail:
    book = models.LogBook("book")
    flow = models.FlowDetail("flow", uuid=f"flow-{book.uuid}")
    task = models.TaskDetail("locked-task", uuid=f"task-{book.uuid}")
    flow.add(task)
    book.add(flow)
    conn.save_logbook(book)
    return task


def test_postgresql_row_lock_fails_by_name_instead_of_blocking(postgres_schema_url: str) -> None:
    import psycopg

    uri = f"{postgres_schema_url}&lock_timeout=0.3"
    with backends.backend(uri) as be:
        conn = be.get_connection()
        task = _saved_task(conn)
        holder = psycopg.connect(postgres_schema_url)
        # Ends the holder's transaction if the backend never gives up: the test then fails on
        # an update that did not raise, instead of hanging.
        release = threading.Timer(20, holder.rollback)
        try:
            holder.execute("SELECT * FROM atomdetails WHERE uuid = %s FOR UPDATE", (task.uuid,))
            release.start()
            task.put(states.SUCCESS, "while locked")
            with pytest.raises(exc.BackendError) as caught:
                conn.update_atom_details(task)
        finally:
            release.cancel()
            holder.rollback()
            holder.close()
        message = str(caught.value)
        assert task.uuid in message and "'locked-task'" in message, message
        assert "sqlalchemy backend" in message and "lock timeout" in message, message
        assert conn.get_atom_details(task.uuid).results is None  # nothing half-written
        conn.update_atom_details(task)
        assert conn.get_atom_details(task.uuid).results == "while locked"


def test_postgresql_timeouts_have_defaults_and_options(postgres_schema_url: str) -> None:
    import sqlalchemy as sa

    def settings(uri: str) -> tuple[str, str]:
        be = backends.fetch(uri)
        try:
            with be.engine.connect() as conn:  # type: ignore[attr-defined]
                return (conn.execute(sa.text("SHOW lock_timeout")).scalar_one(),
                        conn.execute(sa.text("SHOW statement_timeout")).scalar_one())
        finally:
            be.close()

    assert settings(postgres_schema_url) == ("30s", "2min")
    assert settings(f"{postgres_schema_url}&lock_timeout=1.5&statement_timeout=0") == (
        "1500ms", "0")
