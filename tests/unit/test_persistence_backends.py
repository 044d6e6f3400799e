"""Finding backends from URIs and dicts, the backend() helper, and persistence_utils."""

from __future__ import annotations

import contextlib
import gc
import os
import weakref
from pathlib import Path

import pytest

from flowengine import engines, task
from flowengine import exceptions as exc
from flowengine.flows import linear_flow
from flowengine.persistence import backends, base, models
from flowengine.persistence.backends.impl_dir import DirBackend
from flowengine.persistence.backends.impl_memory import MemoryBackend
from flowengine.persistence.backends.impl_sqlalchemy import SQLAlchemyBackend
from flowengine.utils import persistence_utils as pu


@pytest.mark.parametrize(
    "conf, cls",
    [
        ("memory://", MemoryBackend),
        ({"connection": "memory"}, MemoryBackend),
        ("sqlite://", SQLAlchemyBackend),
        ("postgresql://u:pw@127.0.0.1/db", SQLAlchemyBackend),
        ("postgresql+psycopg://u:pw@127.0.0.1/db", SQLAlchemyBackend),
    ],
)
def test_fetch_picks_the_backend_by_scheme(conf: str | dict[str, str], cls: type) -> None:
    be = backends.fetch(conf)
    try:
        assert type(be) is cls
    finally:
        be.close()


@pytest.mark.parametrize("uri", ["file://{p}", "dir://{p}"])
def test_dir_uris_carry_the_path(tmp_path: Path, uri: str) -> None:
    be = backends.fetch(uri.format(p=tmp_path / "records"))
    assert isinstance(be, DirBackend) and be.path == str(tmp_path / "records")


def test_dir_dict_conf_like_taskflow(tmp_path: Path) -> None:
    be = backends.fetch({"connection": "dir", "path": str(tmp_path)})
    assert isinstance(be, DirBackend) and be.path == str(tmp_path)
    with pytest.raises(ValueError, match="path"):
        backends.fetch("dir")


def test_plain_postgresql_url_uses_psycopg_and_query_options_are_ours() -> None:
    be = backends.fetch("postgresql://u:pw@127.0.0.1/db?max_retries=2&connect_timeout=4")
    try:
        assert isinstance(be, SQLAlchemyBackend)
        assert be.engine.url.drivername == "postgresql+psycopg"
        assert dict(be.engine.url.query) == {}  # not handed to the driver
        assert "pw" not in repr(be.engine)
    finally:
        be.close()


def test_unknown_scheme_names_it() -> None:
    with pytest.raises(exc.NotFound, match="'zookeeper'"):
        backends.fetch("zookeeper://localhost:2181")
    with pytest.raises(exc.NotFound, match="'memory'.*group 'elsewhere'"):
        backends.fetch("memory://", namespace="elsewhere")


def test_fetch_rejects_bad_configuration() -> None:
    with pytest.raises(TypeError):
        backends.fetch(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="connection"):
        backends.fetch({"path": "/tmp"})
    with pytest.raises(TypeError):
        MemoryBackend(["not", "a", "dict"])  # type: ignore[arg-type]


def test_backend_context_manager_upgrades_then_closes(tmp_path: Path) -> None:
    with backends.backend(f"dir://{tmp_path}") as be:
        assert isinstance(be, DirBackend)
        be.get_connection().validate()
    assert {p.name for p in tmp_path.iterdir()} >= {"books", "flow_details", "atom_details"}


def test_dir_validate_before_upgrade_names_the_missing_directory(tmp_path: Path) -> None:
    conn = backends.fetch(f"dir://{tmp_path}/absent").get_connection()
    with pytest.raises(exc.StorageFailure,
                       match="absent/books.*run: flowengine db upgrade --backend dir:///"):
        conn.validate()


def test_a_dir_record_another_process_rewrote_is_read_again(tmp_path: Path) -> None:
    # doc/persistence.rst: files are always read afresh, as another process may have changed
    # them; the cache only saves reading a file that did not change.
    with backends.backend(f"dir://{tmp_path}") as mine, \
            backends.backend(f"dir://{tmp_path}") as theirs:
        book = models.LogBook("book")
        book.add(models.FlowDetail("flow", "flow-1"))
        reader = mine.get_connection()
        reader.save_logbook(book)
        assert reader.get_flow_details("flow-1").state is None  # read, and now cached
        writer = theirs.get_connection()
        changed = writer.get_flow_details("flow-1")
        changed.state = "REVERTED"
        writer.update_flow_details(changed)
        assert reader.get_flow_details("flow-1").state == "REVERTED"


@pytest.fixture
def memory() -> base.Backend:
    with backends.backend("memory://") as be:
        return be


def test_temporary_log_book_and_flow_detail(memory: base.Backend) -> None:
    book = pu.temporary_log_book(memory)
    conn = memory.get_connection()
    assert conn.get_logbook(book.uuid).name == "tmp"
    assert pu.temporary_log_book().uuid != book.uuid  # no backend: not saved anywhere

    book, flow = pu.temporary_flow_detail(memory, meta={"k": 1})
    assert book.find(flow.uuid) is flow and flow.meta == {"k": 1}
    assert conn.get_flow_details(flow.uuid).meta == {"k": 1}


def test_create_flow_detail(memory: base.Backend) -> None:
    class Flow:
        name = "provision"

    book = models.LogBook("jobs")
    flow = pu.create_flow_detail(Flow(), book=book, backend=memory, meta={"a": 1})
    assert flow.name == "provision" and book.find(flow.uuid) is flow
    stored = memory.get_connection().get_logbook(book.uuid)
    assert stored.find(flow.uuid) is not None

    nameless = pu.create_flow_detail(object())
    assert nameless.name == nameless.uuid
    orphan = pu.create_flow_detail(Flow(), backend=memory)  # a temporary book is saved
    owners = [b for b in memory.get_connection().get_logbooks() if b.find(orphan.uuid) is not None]
    assert [b.name for b in owners] == ["tmp"]


def test_a_closed_sql_backend_leaves_nothing_behind(tmp_path: Path) -> None:
    # One backend per engines.load(backend=URI) in a long-lived service: each must be freed.
    be = backends.fetch(f"sqlite:///{tmp_path}/freed.db")
    assert isinstance(be, SQLAlchemyBackend)
    engine = weakref.ref(be.engine)
    with contextlib.closing(be.get_connection()) as conn:
        conn.upgrade()
    be.close()
    del be, conn
    gc.collect()
    assert engine() is None, "something still holds the SQLAlchemy engine"


def test_a_forked_child_opens_its_own_sql_connections(tmp_path: Path) -> None:
    be = backends.fetch(f"sqlite:///{tmp_path}/forked.db")
    assert isinstance(be, SQLAlchemyBackend)
    try:
        with contextlib.closing(be.get_connection()) as conn:
            conn.upgrade()
            conn.save_logbook(models.LogBook("parent's", uuid="book"))
        assert be.engine.pool.checkedin() == 1  # type: ignore[attr-defined]
        pid = os.fork()
        if pid == 0:  # the child: never share the parent's SQLite connection
            code = 1
            with contextlib.suppress(BaseException):
                fresh = be.engine.pool.checkedin() == 0  # type: ignore[attr-defined]
                name = be.get_connection().get_logbook("book").name
                code = 0 if fresh and name == "parent's" else 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        be.close()


class _Step(task.Task):
    def execute(self) -> str:
        return self.name


def test_a_backend_object_the_caller_passes_is_never_closed_by_an_engine() -> None:
    # doc/persistence.rst: "A backend object you pass is yours and is never closed by an
    # engine." An in-memory SQLite database lives as long as its connections: closing the
    # backend would lose every record the caller still means to read.
    backend = backends.fetch("sqlite://")
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    try:
        engines.run(linear_flow.Flow("kept").add(_Step("one")), backend=backend)
        loaded = engines.load(linear_flow.Flow("kept").add(_Step("two")), backend=backend)
        loaded.run()
        del loaded
        gc.collect()  # an engine's end must not close it either
        with contextlib.closing(backend.get_connection()) as conn:
            flows = [fd.name for book in conn.get_logbooks() for fd in book]
        assert sorted(flows) == ["kept", "kept"]
    finally:
        backend.close()
