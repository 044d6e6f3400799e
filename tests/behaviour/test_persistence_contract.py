"""One persistence contract, run against every backend: memory, dir, SQLite, PostgreSQL, MariaDB.

PostgreSQL runs against the real server from `.ci/services.sh start` (see tests/conftest.py),
MariaDB against the cluster suite's (`.ci/cluster.sh`, marked `cluster`).
The last tests run real flows: a suspended one resumed, and a reverted one reset and run again,
each by an engine on a second backend object, as a new process would do it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow
from flowengine.persistence import backends, base, models
from flowengine.storage import Storage
from flowengine.types.failure import Failure

from . import tasks

BACKENDS = ["memory", "dir", "sqlite", "postgresql",
            pytest.param("mariadb", marks=pytest.mark.cluster)]


class Store:
    """A backend under test, with a way to open a second backend on the same data."""

    def __init__(self, uri: str, shared: bool) -> None:
        self.uri = uri
        self.shared = shared  # whether a second backend object sees the same records
        self.backend = backends.fetch(uri)
        self._opened: list[base.Backend] = [self.backend]
        with contextlib.closing(self.backend.get_connection()) as conn:
            conn.upgrade()
        self.conn = self.backend.get_connection()

    def reopen(self) -> base.Connection:
        other = backends.fetch(self.uri)
        self._opened.append(other)
        return other.get_connection()

    def close(self) -> None:
        for backend in self._opened:
            backend.close()


def _open_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if kind == "memory":
        uri, shared = "memory://", False
    elif kind == "dir":
        uri, shared = f"dir://{tmp_path}/records", True
    elif kind == "sqlite":
        uri, shared = f"sqlite:///{tmp_path}/records.db", True
    elif kind == "mariadb":
        uri, shared = request.getfixturevalue("mariadb_database_url"), True
    else:
        uri, shared = request.getfixturevalue("postgres_schema_url"), True
    return Store(uri, shared)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = _open_store(request.param, request, tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=[kind for kind in BACKENDS if kind != "memory"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Backends whose records live outside the backend object (all but memory)."""
    s = _open_store(request.param, request, tmp_path)
    try:
        yield s
    finally:
        s.close()


def _failure(message: str = "boom") -> Failure:
    try:
        raise RuntimeError(message)
    except RuntimeError:
        return Failure()


def _book_with_flow(atoms: int = 2) -> tuple[models.LogBook, models.FlowDetail]:
    book = models.LogBook("book")
    flow = models.FlowDetail("flow", uuid=f"flow-{book.uuid}")
    for i in range(atoms):
        flow.add(models.TaskDetail(f"task-{i}", uuid=f"task-{i}-{book.uuid}"))
    book.add(flow)
    return book, flow


def test_empty_backend_has_no_logbooks(store: Store) -> None:
    assert list(store.conn.get_logbooks()) == []
    assert store.conn.backend is store.backend


def test_logbook_round_trip(store: Store) -> None:
    book, flow = _book_with_flow()
    book.meta = {"owner": "ops", "nested": {"list": [1, 2.5, None, "é"]}}
    store.conn.save_logbook(book)

    loaded = store.conn.get_logbook(book.uuid)
    assert (loaded.uuid, loaded.name, loaded.meta) == (book.uuid, "book", book.meta)
    assert loaded.created_at == book.created_at
    assert loaded.updated_at == book.updated_at
    assert [fd.uuid for fd in loaded] == [flow.uuid]
    loaded_flow = loaded.find(flow.uuid)
    assert loaded_flow is not None
    assert sorted(ad.name for ad in loaded_flow) == ["task-0", "task-1"]


def test_a_megabyte_result_round_trips(store: Store) -> None:
    # Results are JSON text: a column type sized in kilobytes (MySQL's TEXT) would cut or
    # refuse it, and a four-byte character needs utf8mb4 there.
    book, flow = _book_with_flow(atoms=1)
    store.conn.save_logbook(book)
    atom = next(iter(flow))
    atom.state = states.SUCCESS
    atom.results = {"rows": ["x" * 1023] * 1024, "note": "\U0001F600 é"}
    store.conn.update_atom_details(atom)

    reader = store.reopen() if store.shared else store.conn
    assert reader.get_atom_details(atom.uuid).results == atom.results


def test_lazy_loads_skip_contents(store: Store) -> None:
    book, flow = _book_with_flow()
    store.conn.save_logbook(book)
    assert len(store.conn.get_logbook(book.uuid, lazy=True)) == 0
    assert len(store.conn.get_flow_details(flow.uuid, lazy=True)) == 0
    assert len(store.conn.get_flow_details(flow.uuid)) == 2
    assert [len(b) for b in store.conn.get_logbooks(lazy=True)] == [0]
    assert [len(b) for b in store.conn.get_logbooks()] == [1]
    flows = list(store.conn.get_flows_for_book(book.uuid, lazy=True))
    assert [len(fd) for fd in flows] == [0]
    assert [len(fd) for fd in store.conn.get_flows_for_book(book.uuid)] == [2]


def test_listing_children(store: Store) -> None:
    book, flow = _book_with_flow(atoms=3)
    other = models.LogBook("other")
    store.conn.save_logbook(book)
    store.conn.save_logbook(other)
    assert {b.uuid for b in store.conn.get_logbooks()} == {book.uuid, other.uuid}
    assert list(store.conn.get_flows_for_book(other.uuid)) == []
    atoms = {ad.uuid for ad in store.conn.get_atoms_for_flow(flow.uuid)}
    assert atoms == {ad.uuid for ad in flow}


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_logbook("missing"),
        lambda c: c.get_flow_details("missing"),
        lambda c: c.get_atom_details("missing"),
        lambda c: c.destroy_logbook("missing"),
        lambda c: list(c.get_flows_for_book("missing")),
        lambda c: list(c.get_atoms_for_flow("missing")),
        lambda c: c.update_flow_details(models.FlowDetail("f", "missing")),
        lambda c: c.update_atom_details(models.TaskDetail("t", "missing")),
    ],
    ids=["book", "flow", "atom", "destroy", "flows-of", "atoms-of", "update-flow", "update-atom"],
)
def test_missing_records_raise_not_found(
    store: Store, call: Callable[[base.Connection], object]
) -> None:
    with pytest.raises(exc.NotFound, match="missing"):
        call(store.conn)


def test_task_detail_states_round_trip(store: Store) -> None:
    book, flow = _book_with_flow(atoms=1)
    (task,) = list(flow)
    task.version = "1.2"
    task.meta["progress"] = 0.5
    store.conn.save_logbook(book)

    task.put(states.SUCCESS, {"rows": [1, 2, 3], "name": "ünïcode"})
    stored = store.conn.update_atom_details(task)
    assert stored.results == {"rows": [1, 2, 3], "name": "ünïcode"}

    task.intention = states.REVERT
    task.put(states.REVERT_FAILURE, _failure("revert broke"))
    store.conn.update_atom_details(task)
    loaded = store.conn.get_atom_details(task.uuid)
    assert isinstance(loaded, models.TaskDetail)
    assert loaded.state == states.REVERT_FAILURE
    assert loaded.intention == states.REVERT
    assert loaded.results is None
    assert loaded.revert_failure is not None
    assert loaded.revert_failure.matches(task.revert_failure)
    assert loaded.revert_failure.check(RuntimeError) is RuntimeError
    assert (loaded.version, loaded.meta) == ("1.2", {"progress": 0.5})

    task.put(states.FAILURE, _failure())
    store.conn.update_atom_details(task)
    loaded = store.conn.get_atom_details(task.uuid)
    assert loaded.failure is not None and loaded.failure.exception_str == "boom"
    assert loaded.revert_failure is None


def test_retry_detail_history_round_trip(store: Store) -> None:
    book = models.LogBook("book")
    flow = models.FlowDetail("flow", uuid=f"flow-{book.uuid}")
    retry = models.RetryDetail("retry", uuid=f"retry-{book.uuid}")
    flow.add(retry)
    book.add(flow)
    store.conn.save_logbook(book)

    retry.put(states.SUCCESS, 1)
    retry.results[-1][1]["task-a"] = _failure("first")
    retry.put(states.SUCCESS, {"attempt": 2})
    retry.put(states.REVERTED, "undone")
    store.conn.update_flow_details(flow)

    loaded = store.conn.get_atom_details(retry.uuid)
    assert isinstance(loaded, models.RetryDetail)
    assert [data for data, _ in loaded.results] == [1, {"attempt": 2}]
    assert loaded.results[0][1]["task-a"].exception_str == "first"
    assert loaded.last_results == {"attempt": 2}
    assert loaded.last_failures == {}
    assert loaded.revert_results == "undone"


def test_update_flow_details_merges_and_adds_atoms(store: Store) -> None:
    book, flow = _book_with_flow(atoms=1)
    store.conn.save_logbook(book)

    flow.state = states.RUNNING
    flow.meta["step"] = 2
    added = models.TaskDetail("late", uuid=f"late-{book.uuid}")
    flow.add(added)
    stored = store.conn.update_flow_details(flow)
    assert {ad.uuid for ad in stored} == {ad.uuid for ad in flow}

    loaded = store.conn.get_flow_details(flow.uuid)
    assert (loaded.state, loaded.meta) == (states.RUNNING, {"step": 2})
    assert loaded.find(added.uuid) is not None


def test_saving_again_keeps_stored_flows(store: Store) -> None:
    book, first = _book_with_flow(atoms=1)
    store.conn.save_logbook(book)

    fresh = store.conn.get_logbook(book.uuid, lazy=True)
    second = models.FlowDetail("second", uuid=f"second-{book.uuid}")
    fresh.add(second)
    fresh.meta["saved"] = 2
    merged = store.conn.save_logbook(fresh)
    assert {fd.uuid for fd in merged} == {first.uuid, second.uuid}

    loaded = store.conn.get_logbook(book.uuid)
    assert {fd.uuid for fd in loaded} == {first.uuid, second.uuid}
    assert loaded.meta == {"saved": 2}
    loaded_first = loaded.find(first.uuid)
    assert loaded_first is not None and len(loaded_first) == 1


def test_stored_records_are_copies(store: Store) -> None:
    book, flow = _book_with_flow(atoms=1)
    (task,) = list(flow)
    task.put(states.SUCCESS, {"value": [1]})
    store.conn.save_logbook(book)
    task.results["value"].append(2)  # changed locally, never saved
    assert store.conn.get_atom_details(task.uuid).results == {"value": [1]}


def test_destroy_logbook_removes_its_records_only(store: Store) -> None:
    book, flow = _book_with_flow()
    keep, kept_flow = _book_with_flow()
    store.conn.save_logbook(book)
    store.conn.save_logbook(keep)

    store.conn.destroy_logbook(book.uuid)
    with pytest.raises(exc.NotFound):
        store.conn.get_logbook(book.uuid)
    with pytest.raises(exc.NotFound):
        store.conn.get_flow_details(flow.uuid)
    for ad in flow:
        with pytest.raises(exc.NotFound):
            store.conn.get_atom_details(ad.uuid)
    assert len(store.conn.get_flow_details(kept_flow.uuid)) == 2


def test_clear_all(store: Store) -> None:
    book, flow = _book_with_flow()
    store.conn.save_logbook(book)
    store.conn.clear_all()
    assert list(store.conn.get_logbooks()) == []
    with pytest.raises(exc.NotFound):
        store.conn.get_flow_details(flow.uuid)
    store.conn.save_logbook(book)  # usable afterwards
    assert len(store.conn.get_logbook(book.uuid)) == 1


def test_upgrade_and_validate_are_repeatable(store: Store) -> None:
    book, _ = _book_with_flow()
    store.conn.save_logbook(book)
    store.conn.upgrade()
    store.conn.validate()
    assert len(store.conn.get_logbook(book.uuid)) == 1


def test_records_outlive_the_backend_object(shared_store: Store) -> None:
    store = shared_store
    book, flow = _book_with_flow()
    (task, _) = list(flow)
    task.put(states.SUCCESS, 42)
    store.conn.save_logbook(book)
    store.backend.close()

    other = store.reopen()
    assert other.get_atom_details(task.uuid).results == 42
    assert len(other.get_logbook(book.uuid)) == 1


def test_unencodable_result_is_refused_by_name(shared_store: Store) -> None:
    store = shared_store
    book, flow = _book_with_flow(atoms=1)
    (task,) = list(flow)
    store.conn.save_logbook(book)
    task.put(states.SUCCESS, {1, 2})
    with pytest.raises(exc.StorageFailure, match=task.uuid):
        store.conn.update_atom_details(task)
    assert store.conn.get_atom_details(task.uuid).results is None


def test_threads_updating_one_flow(store: Store) -> None:
    book, flow = _book_with_flow(atoms=8)
    store.conn.save_logbook(book)
    errors: list[BaseException] = []

    def work(task: models.AtomDetail) -> None:
        try:
            conn = store.backend.get_connection()
            for i in range(5):
                task.put(states.SUCCESS, {"atom": task.name, "i": i})
                conn.update_atom_details(task)
        except BaseException as err:  # collected and re-raised by the test thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(ad,)) for ad in flow]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    loaded = store.conn.get_flow_details(flow.uuid)
    assert {ad.name: ad.results for ad in loaded} == {
        ad.name: {"atom": ad.name, "i": 4} for ad in flow
    }


# ---- resuming real flows ----------------------------------------------------------------------

#: The atom detail holding values given with ``store=``.
INJECTOR = Storage.injector_name


def _states(fd: models.FlowDetail) -> dict[str, str | None]:
    return {ad.name: ad.state for ad in fd if ad.name != INJECTOR}


def _three_steps() -> linear_flow.Flow:
    return linear_flow.Flow("three").add(tasks.Step("a"), tasks.Step("b"), tasks.Step("c"))


def test_a_suspended_flow_resumes_where_it_stopped(shared_store: Store) -> None:
    engine = engines.load(_three_steps(), book=models.LogBook("book"),
                          backend=shared_store.backend)

    def suspend_after_a(state: str, details: dict[str, object]) -> None:
        if details["task_name"] == "a":
            engine.suspend()

    engine.atom_notifier.register(states.SUCCESS, suspend_after_a)
    engine.run()
    conn = shared_store.reopen()
    stored = conn.get_flow_details(engine.storage.flow_uuid)
    assert stored.state == states.SUSPENDED
    assert _states(stored) == {"a": states.SUCCESS, "b": states.PENDING, "c": states.PENDING}

    engines.load(_three_steps(), flow_detail=stored, backend=conn.backend).run()
    assert tasks.names("execute") == ["a", "b", "c"], "a ran again after resuming"
    final = shared_store.reopen().get_flow_details(stored.uuid)
    assert final.state == states.SUCCESS
    assert {ad.name: ad.results for ad in final if ad.name != INJECTOR} == {
        "a": "a", "b": "b", "c": "c"}


def _checked_step() -> linear_flow.Flow:
    return linear_flow.Flow("checked").add(tasks.Step("a"), tasks.FailOn("check"))


def test_a_reverted_flow_is_reset_and_runs_again(shared_store: Store) -> None:
    engine = engines.load(_checked_step(), store={"value": 1, "bad": [1]},
                          book=models.LogBook("book"), backend=shared_store.backend)
    with pytest.raises(tasks.Boom):
        engine.run()
    conn = shared_store.reopen()
    stored = conn.get_flow_details(engine.storage.flow_uuid)
    assert stored.state == states.REVERTED
    assert _states(stored) == {"a": states.REVERTED, "check": states.REVERTED}
    assert "a" in tasks.names("revert")

    # The input is fixed and the flow run again: every atom starts afresh.
    engines.load(_checked_step(), flow_detail=stored, backend=conn.backend,
                 store={"bad": []}).run()
    assert tasks.names("execute") == ["a", "check", "a", "check"]
    final = shared_store.reopen().get_flow_details(stored.uuid)
    assert final.state == states.SUCCESS
    assert _states(final) == {"a": states.SUCCESS, "check": states.SUCCESS}
    assert {ad.name: ad.results for ad in final if ad.name != INJECTOR} == {
        "a": "a", "check": 1}
