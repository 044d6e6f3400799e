"""An engine that cannot store an atom's state halts: it runs no unrecorded work, reverts nothing,
and leaves the stored record as it was, so a resume finishes the flow; which backend an engine's
storage has, and who closes it."""

from __future__ import annotations

import contextlib
import gc
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from flowengine import engines, exceptions, states, task
from flowengine.flows import linear_flow as lf
from flowengine.persistence import backends, base, models
from flowengine.persistence.backends import impl_memory

RAN: list[str] = []
REVERTED: list[str] = []


class Step(task.Task):
    def execute(self) -> str:
        RAN.append(self.name)
        return self.name

    def revert(self, **kwargs: Any) -> None:
        REVERTED.append(self.name)


class FailingConnection:
    """Wraps a real connection; atom writes fail once ``budget`` of them have succeeded."""

    def __init__(self, inner: base.Connection, budget: list[int]) -> None:
        self._inner = inner
        self._budget = budget

    def update_atom_details(self, atom_detail: Any) -> Any:
        if self._budget[0] <= 0:
            raise OSError("disk is read-only")
        self._budget[0] -= 1
        return self._inner.update_atom_details(atom_detail)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ReadOnlyLater(impl_memory.MemoryBackend):
    def __init__(self, writes_allowed: int) -> None:
        super().__init__()
        self.budget = [writes_allowed]

    def get_connection(self) -> Any:
        return FailingConnection(super().get_connection(), self.budget)


def test_an_engine_that_cannot_store_a_running_state_halts_and_a_resume_finishes() -> None:
    RAN.clear()
    REVERTED.clear()
    backend = ReadOnlyLater(writes_allowed=2)  # a: RUNNING, SUCCESS; then b's RUNNING fails
    flow = lf.Flow("f").add(Step("a"), Step("b"), Step("c"))
    engine = engines.load(flow, backend=backend)
    with pytest.raises(exceptions.RunHalted, match="'b'") as caught:
        engine.run()
    assert "read-only" in str(caught.value) and "Nothing was started or reverted" in str(
        caught.value)
    assert isinstance(caught.value, exceptions.StorageFailure)  # what TaskFlow code catches
    assert RAN == ["a"], "b must not run: its RUNNING state was never stored"
    assert REVERTED == [], "a revert nobody can record must not run"
    flow_uuid = engine.storage.flow_uuid
    conn = backend.get_connection()
    stored = conn.get_flow_details(flow_uuid)
    assert stored.state == states.RUNNING  # as after a crash: nothing claims an ending
    assert {ad.name: ad.state for ad in stored} == {
        "a": states.SUCCESS, "b": states.PENDING, "c": states.PENDING}
    # The backend is back: a new engine resumes from what is stored, and runs a only once.
    backend.budget[0] = 1_000
    resumed = engines.load(lf.Flow("f").add(Step("a"), Step("b"), Step("c")),
                           flow_detail=conn.get_flow_details(flow_uuid), backend=backend)
    resumed.run()
    assert RAN == ["a", "b", "c"] and REVERTED == []
    assert conn.get_flow_details(flow_uuid).state == states.SUCCESS


def test_a_halted_engine_run_again_first_writes_what_it_did() -> None:
    RAN.clear()
    REVERTED.clear()
    backend = ReadOnlyLater(writes_allowed=3)  # a: RUNNING, SUCCESS; b: RUNNING; not b's SUCCESS
    engine = engines.load(lf.Flow("f").add(Step("a"), Step("b"), Step("c")), backend=backend)
    with pytest.raises(exceptions.RunHalted, match="'b'"):
        engine.run()
    assert RAN == ["a", "b"] and REVERTED == []
    conn = backend.get_connection()
    stored = conn.get_flow_details(engine.storage.flow_uuid)
    assert {ad.name: ad.state for ad in stored} == {
        "a": states.SUCCESS, "b": states.RUNNING, "c": states.PENDING}
    # Run again: b's outcome, known only in memory, is written first (the whole flow detail
    # goes through here), then c's RUNNING is refused again: halted before c runs.
    with pytest.raises(exceptions.RunHalted, match="'c'"):
        engine.run()
    assert RAN == ["a", "b"]
    assert {ad.name: ad.state for ad in conn.get_flow_details(engine.storage.flow_uuid)} == {
        "a": states.SUCCESS, "b": states.SUCCESS, "c": states.PENDING}
    backend.budget[0] = 1_000
    engine.run()
    assert RAN == ["a", "b", "c"] and REVERTED == []
    assert {ad.name: ad.state for ad in conn.get_flow_details(engine.storage.flow_uuid)} == {
        "a": states.SUCCESS, "b": states.SUCCESS, "c": states.SUCCESS}


class LockTheDatabase(task.Task):
    """Takes SQLite's write lock from another connection, as another process would."""

    holders: list[sqlite3.Connection] = []
    path = ""

    def execute(self) -> str:
        holder = sqlite3.connect(self.path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        self.holders.append(holder)
        return "locked"


def test_the_first_storage_failure_is_the_one_raised(tmp_path: Path) -> None:
    # The task's SUCCESS cannot be stored (locked): the engine halts, and the error raised
    # names that write, its atom and the backend.
    db = tmp_path / "locked.db"
    LockTheDatabase.path = str(db)
    engine = engines.load(lf.Flow("f").add(LockTheDatabase("locker")), book=models.LogBook("b"),
                          backend=f"sqlite:///{db}?busy_timeout=0.05")
    try:
        with pytest.raises(exceptions.RunHalted, match="could not be recorded") as caught:
            engine.run()
    finally:
        for holder in LockTheDatabase.holders:
            holder.close()
        LockTheDatabase.holders.clear()
    message = str(caught.value)
    assert "updating atom detail" in message and "'locker'" in message, message
    assert str(db) in message and "locked" in message
    assert isinstance(caught.value.cause, exceptions.BackendError)


def test_storage_without_a_backend_gets_a_memory_backend_as_in_taskflow() -> None:
    engine = engines.load(lf.Flow("f").add(Step("a"), Step("b")))
    engine.prepare()
    backend = engine.storage.backend
    assert isinstance(backend, impl_memory.MemoryBackend)
    assert engine.storage.backend is backend
    engine.run()
    # The flow detail is stored in no logbook, and holds every change made after the access.
    conn = backend.get_connection()
    assert list(conn.get_logbooks()) == []
    stored = conn.get_flow_details(engine.storage.flow_uuid)
    assert stored.state == states.SUCCESS
    assert {ad.name: ad.results for ad in stored} == {"a": "a", "b": "b"}


def _open_files(path: Path) -> list[str]:
    """Descriptors of this process open on ``path`` (or its -wal/-shm files)."""
    fds = Path("/proc/self/fd")
    found = []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(str(path)):
                found.append(target)
    return found


def test_a_backend_built_from_a_uri_is_closed_with_its_engine(tmp_path: Path) -> None:
    db = tmp_path / "owned.db"
    flow = lf.Flow("f").add(Step("a"))
    engine = engines.load(flow, book=models.LogBook("b"), backend=f"sqlite:///{db}")
    engine.run()
    assert _open_files(db), "the pool keeps a connection while the engine lives"
    del engine
    gc.collect()
    assert _open_files(db) == []

    engines.run(lf.Flow("g").add(Step("a")), book=models.LogBook("b"), backend=f"sqlite:///{db}")
    assert _open_files(db) == []


def test_a_backend_object_is_never_closed_by_the_engine(tmp_path: Path) -> None:
    db = tmp_path / "given.db"
    with backends.backend(f"sqlite:///{db}") as backend:
        engine = engines.load(lf.Flow("f").add(Step("a")), book=models.LogBook("b"),
                              backend=backend)
        engine.run()
        del engine
        gc.collect()
        engines.run(lf.Flow("g").add(Step("a")), book=models.LogBook("b"), backend=backend)
        assert _open_files(db), "the caller's backend keeps its pooled connection"
    assert _open_files(db) == []
