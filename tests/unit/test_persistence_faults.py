"""Damaged, foreign, locked, read-only and unreachable storage: clear errors, nothing lost."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import backends, base, models
from flowengine.persistence.base import CorruptRecord


def _saved_book(conn: base.Connection) -> tuple[models.LogBook, models.TaskDetail]:
    book = models.LogBook("book")
    flow = models.FlowDetail("flow", uuid=f"flow-{book.uuid}")
    task = models.TaskDetail("task", uuid=f"task-{book.uuid}")
    task.put(states.SUCCESS, {"kept": True})
    flow.add(task)
    book.add(flow)
    conn.save_logbook(book)
    return book, task


@contextlib.contextmanager
def _connection(uri: str, **conf: object) -> Iterator[base.Connection]:
    with backends.backend({"connection": uri, **conf}) as be:
        with contextlib.closing(be.get_connection()) as conn:
            yield conn


# ---- dir backend -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b'{"atom": {"name": "t", "uu', b"[1, 2, 3]", b'{"atom": {}, "type": "GHOST"}', b"\xff\xfe"],
    ids=["truncated", "not-an-object", "unknown-type", "not-utf8"],
)
def test_dir_damaged_atom_record_is_named(tmp_path: Path, content: bytes) -> None:
    with _connection(f"dir://{tmp_path}") as conn:
        book, task = _saved_book(conn)
        other, other_task = _saved_book(conn)
        record = tmp_path / "atom_details" / task.uuid / "metadata"
        record.write_bytes(content)

        with pytest.raises(CorruptRecord) as caught:
            conn.get_atom_details(task.uuid)
        assert task.uuid in str(caught.value) and str(tmp_path) in str(caught.value)
        assert caught.value.uuid == task.uuid and caught.value.kind == "atom detail"
        with pytest.raises(CorruptRecord, match=task.uuid):
            conn.get_logbook(book.uuid)
        # Everything else is still readable and writable; the damaged file is left for a human.
        assert conn.get_atom_details(other_task.uuid).results == {"kept": True}
        _saved_book(conn)
        assert record.read_bytes() == content


def test_dir_record_filed_under_another_uuid_is_refused(tmp_path: Path) -> None:
    with _connection(f"dir://{tmp_path}") as conn:
        book, _ = _saved_book(conn)
        data = json.loads((tmp_path / "books" / book.uuid / "metadata").read_text())
        imposter = tmp_path / "books" / "imposter"
        imposter.mkdir()
        (imposter / "metadata").write_text(json.dumps(data))
        with pytest.raises(CorruptRecord, match="imposter"):
            conn.get_logbook("imposter")


def test_dir_link_to_a_missing_record_is_named(tmp_path: Path) -> None:
    with _connection(f"dir://{tmp_path}") as conn:
        book, task = _saved_book(conn)
        (tmp_path / "atom_details" / task.uuid / "metadata").unlink()
        with pytest.raises(CorruptRecord, match=f"{task.uuid}.*missing"):
            conn.get_logbook(book.uuid)


def test_dir_read_only_filesystem_fails_by_name_and_keeps_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _connection(f"dir://{tmp_path}") as conn:
        book, task = _saved_book(conn)

        def read_only(src: str, dst: str) -> None:
            raise OSError(errno.EROFS, "Read-only file system", dst)

        # The filesystem is the process edge; root ignores permission bits, so fake EROFS here.
        monkeypatch.setattr(os, "replace", read_only)
        task.put(states.SUCCESS, "new")
        with pytest.raises(exc.BackendError) as caught:
            conn.update_atom_details(task)
        message = str(caught.value)
        assert task.uuid in message and "dir backend" in message and "Read-only" in message
        monkeypatch.undo()
        assert conn.get_atom_details(task.uuid).results == {"kept": True}
        assert [p for p in tmp_path.rglob("*.tmp")] == []


def test_dir_uuid_cannot_escape_the_directory(tmp_path: Path) -> None:
    with _connection(f"dir://{tmp_path}/store") as conn:
        with pytest.raises(exc.StorageFailure, match="cannot be used as a file name"):
            conn.save_logbook(models.LogBook("evil", uuid="../../escaped"))
    assert not (tmp_path / "escaped").exists()


def test_dir_leaves_no_temporary_files(tmp_path: Path) -> None:
    with _connection(f"dir://{tmp_path}") as conn:
        _, task = _saved_book(conn)
        for i in range(3):
            task.put(states.SUCCESS, i)
            conn.update_atom_details(task)
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_dir_recovers_from_a_writer_that_died_part_way(tmp_path: Path) -> None:
    with _connection(f"dir://{tmp_path}") as conn:
        book, _ = _saved_book(conn)
        (tmp_path / "books" / "died-before-first-write").mkdir()
        (tmp_path / "books" / ".deleting-gone-1234").mkdir()
        (tmp_path / ".atom_details.deleting-5678").mkdir()
        assert [b.uuid for b in conn.get_logbooks()] == [book.uuid]
        conn.upgrade()
    assert not (tmp_path / "books" / ".deleting-gone-1234").exists()
    assert not (tmp_path / ".atom_details.deleting-5678").exists()


# ---- listing every logbook past damaged records ------------------------------------------------


def _damage(uri: str, tmp_path: Path, kind: str, uuid: str) -> None:
    """Overwrite one stored record with text that is not JSON."""
    if uri.startswith("dir://"):
        table = {"logbook": "books", "flow detail": "flow_details", "atom detail": "atom_details"}
        (tmp_path / table[kind] / uuid / "metadata").write_bytes(b'{"damaged')
        return
    table, column = {"logbook": ("logbooks", "meta"), "flow detail": ("flowdetails", "meta"),
                     "atom detail": ("atomdetails", "results")}[kind]
    with contextlib.closing(sqlite3.connect(tmp_path / "list.db")) as raw:
        raw.execute(f"UPDATE {table} SET {column} = ? WHERE uuid = ?", ('{"damaged', uuid))
        raw.commit()


@pytest.mark.parametrize("scheme", ["dir", "sqlite"])
def test_get_logbooks_leaves_out_damaged_records_and_logs_them(
    tmp_path: Path, scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"dir://{tmp_path}" if scheme == "dir" else f"sqlite:///{tmp_path}/list.db"
    with _connection(uri) as conn:
        intact, _ = _saved_book(conn)
        broken_book, _ = _saved_book(conn)
        mixed, kept_task = _saved_book(conn)
        (kept,) = list(mixed)
        bad_atom_flow = models.FlowDetail("bad-atom", uuid=f"bad-atom-{mixed.uuid}")
        bad_atom = models.TaskDetail("task", uuid=f"bad-task-{mixed.uuid}")
        bad_atom_flow.add(bad_atom)
        bad_flow = models.FlowDetail("bad-flow", uuid=f"bad-flow-{mixed.uuid}")
        mixed.add(bad_atom_flow)
        mixed.add(bad_flow)
        conn.save_logbook(mixed)
        _damage(uri, tmp_path, "logbook", broken_book.uuid)
        _damage(uri, tmp_path, "atom detail", bad_atom.uuid)
        _damage(uri, tmp_path, "flow detail", bad_flow.uuid)

        caplog.set_level(logging.ERROR)
        books = {book.uuid: book for book in conn.get_logbooks()}
        assert set(books) == {intact.uuid, mixed.uuid}
        # A flow with a damaged atom is left out whole: never resumed with an atom missing.
        assert [fd.uuid for fd in books[mixed.uuid]] == [kept.uuid]
        assert [ad.results for ad in books[mixed.uuid].find(kept.uuid)] == [{"kept": True}]
        logged = "\n".join(r.getMessage() for r in caplog.records)
        for uuid in (broken_book.uuid, bad_atom_flow.uuid, bad_atom.uuid, bad_flow.uuid):
            assert uuid in logged, f"{uuid} not named in the log:\n{logged}"
        assert {b.uuid for b in conn.get_logbooks(lazy=True)} == {intact.uuid, mixed.uuid}

        # Asked for by uuid, a damaged record still raises.
        with pytest.raises(CorruptRecord, match=broken_book.uuid):
            conn.get_logbook(broken_book.uuid)
        with pytest.raises(CorruptRecord, match=bad_atom.uuid):
            conn.get_flow_details(bad_atom_flow.uuid)
        assert kept_task.uuid in {ad.uuid for ad in conn.get_atoms_for_flow(kept.uuid)}


# ---- SQL backend -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "column, value",
    [("results", "{not json"), ("atom_type", "GHOST_DETAIL"), ("failure", '{"version": 7}')],
)
def test_sqlite_damaged_atom_row_is_named(tmp_path: Path, column: str, value: str) -> None:
    db = tmp_path / "faults.db"
    with _connection(f"sqlite:///{db}") as conn:
        book, task = _saved_book(conn)
        with contextlib.closing(sqlite3.connect(db)) as raw:
            raw.execute(f"UPDATE atomdetails SET {column} = ? WHERE uuid = ?", (value, task.uuid))
            raw.commit()
        with pytest.raises(CorruptRecord) as caught:
            conn.get_atom_details(task.uuid)
        assert task.uuid in str(caught.value) and "sqlalchemy backend" in str(caught.value)
        with pytest.raises(CorruptRecord):
            conn.get_flow_details(f"flow-{book.uuid}")
        assert conn.get_logbook(book.uuid, lazy=True).name == "book"


def test_sqlite_locked_database_fails_by_name_then_recovers(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    with _connection(f"sqlite:///{db}", busy_timeout=0.2) as conn:
        book, task = _saved_book(conn)
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            task.put(states.SUCCESS, "while locked")
            with pytest.raises(exc.BackendError) as caught:
                conn.update_atom_details(task)
            message = str(caught.value)
            assert "locked" in message and task.uuid in message and str(db) in message
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert conn.get_atom_details(task.uuid).results == {"kept": True}
        conn.update_atom_details(task)
        assert conn.get_atom_details(task.uuid).results == "while locked"


def test_sqlite_read_only_database_reads_but_refuses_writes(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    with _connection(f"sqlite:///{db}") as conn:
        book, task = _saved_book(conn)
    ro = backends.fetch(f"sqlite:///file:{db}?mode=ro&uri=true")
    try:
        conn = ro.get_connection()
        assert conn.get_atom_details(task.uuid).results == {"kept": True}
        task.put(states.SUCCESS, "refused")
        with pytest.raises(exc.BackendError) as caught:
            conn.update_atom_details(task)
        assert "readonly" in str(caught.value) and task.uuid in str(caught.value)
    finally:
        ro.close()


def _book_with_bad_result(result: object) -> models.LogBook:
    """A logbook whose second task holds ``result``, which the backend cannot store."""
    book = models.LogBook("book")
    flow = models.FlowDetail("flow", f"flow-{book.uuid}")
    good, bad = models.TaskDetail("good", "a-good"), models.TaskDetail("bad", "a-bad")
    bad.put(states.SUCCESS, result)
    flow.add(good)
    flow.add(bad)
    book.add(flow)
    return book


def test_sqlite_unencodable_value_rolls_back_the_whole_save(tmp_path: Path) -> None:
    with _connection(f"sqlite:///{tmp_path}/tx.db") as conn:
        book = _book_with_bad_result(object())
        with pytest.raises(exc.StorageFailure, match="a-bad"):
            conn.save_logbook(book)
        assert list(conn.get_logbooks()) == []


def test_memory_failed_write_leaves_nothing_behind() -> None:
    with _connection("memory://") as conn:
        book = _book_with_bad_result(_Uncopyable())
        with pytest.raises(exc.BackendError, match=book.uuid):
            conn.save_logbook(book)
        assert list(conn.get_logbooks()) == []
        with pytest.raises(exc.NotFound):
            conn.get_atom_details("a-good")


class _Uncopyable:
    def __deepcopy__(self, memo: object) -> object:
        raise RuntimeError("cannot copy this")


def test_unreachable_server_fails_without_showing_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    uri = "postgresql://app:s3cr3t-pw@127.0.0.1:1/flows"
    be = backends.fetch({"connection": uri, "connect_timeout": 2})
    try:
        with pytest.raises(exc.BackendError) as caught:
            be.get_connection()
    finally:
        be.close()
    err = caught.value
    shown = " ".join([str(err), err.pformat(), repr(err.args)])
    assert "s3cr3t-pw" not in shown and "s3cr3t-pw" not in caplog.text
    assert "app:***@127.0.0.1:1/flows" in str(err)


def test_unknown_scheme_is_named_without_the_password() -> None:
    with pytest.raises(exc.NotFound) as caught:
        backends.fetch("redis://user:hunter2@localhost/0")
    assert "redis" in str(caught.value) and "hunter2" not in str(caught.value)


def test_missing_postgres_driver_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_psycopg(name: str, *args: object, **kwargs: object) -> object:
        if name == "psycopg" or name.startswith("psycopg."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_psycopg)
    with pytest.raises(ImportError, match=r"flowengine\[postgresql\]"):
        backends.fetch("postgresql://u:pw@127.0.0.1/db")
