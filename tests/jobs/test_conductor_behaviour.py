"""The conductor contract on every jobboard backend: consume, abandon, trash, stop, bounds.

Conductors run on threads of the test process here, over a shared in-memory persistence
backend; ``test_conductor_faults.py`` runs them as separate processes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs_flows
import pytest
from boards import BoardFactory

from flowengine import exceptions as exc
from flowengine import states
from flowengine.conductors import backends as conductors
from flowengine.conductors.backends.impl_executor import ExecutorConductor
from flowengine.jobs.base import JobBoard
from flowengine.jobs.posting import post_flow
from flowengine.persistence.backends import impl_memory


@pytest.fixture
def persistence() -> Iterator[impl_memory.MemoryBackend]:
    backend = impl_memory.MemoryBackend({})
    yield backend
    backend.close()


class Events:
    """Records a conductor's events; waits for one of them."""

    def __init__(self, conductor: ExecutorConductor) -> None:
        self.seen: list[tuple[str, str]] = []
        self._changed = threading.Condition()
        for event in conductor.EVENTS_EMITTED:
            conductor.notifier.register(event, self._on_event)

    def _on_event(self, event: str, details: dict[str, Any]) -> None:
        with self._changed:
            self.seen.append((event, details["job"].uuid))
            self._changed.notify_all()

    def wait_for(self, event: str, count: int = 1, timeout: float = 20.0) -> None:
        with self._changed:
            assert self._changed.wait_for(
                lambda: sum(1 for e, _ in self.seen if e == event) >= count, timeout), self.seen


@contextlib.contextmanager
def running(conductor: ExecutorConductor) -> Iterator[ExecutorConductor]:
    thread = threading.Thread(target=conductor.run, daemon=True)
    thread.start()
    try:
        yield conductor
    finally:
        conductor.stop()
        thread.join(20)
        assert not thread.is_alive()


def make(kind: str, board: JobBoard, persistence: Any, name: str = "c1",
         **options: Any) -> ExecutorConductor:
    conductor = conductors.fetch(kind, name, board, persistence=persistence, **options)
    assert isinstance(conductor, ExecutorConductor)
    return conductor


@pytest.mark.parametrize("kind", ["blocking", "nonblocking"])
def test_a_job_runs_and_is_consumed(kind: str, board: JobBoard, persistence: Any,
                                    tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    job = post_flow(board, persistence, jobs_flows.steps, store={"ledger": str(ledger)})
    conductor = make(kind, board, persistence)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("job_consumed")
    assert job.wait(timeout=5) and job.state == states.COMPLETE
    assert jobs_flows.ledger_lines(ledger) == ["step-1", "step-2", "step-3"]
    names = [event for event, _ in events.seen]
    assert names == ["compilation_start", "compilation_end", "preparation_start",
                     "preparation_end", "validation_start", "validation_end", "running_start",
                     "running_end", "job_consumed"]
    with contextlib.closing(persistence.get_connection()) as conn:
        [flow_detail] = list(conn.get_logbook(job.book_uuid))
        assert flow_detail.state == states.SUCCESS


def test_a_board_failing_once_while_listed_does_not_stop_the_conductor(
        board: JobBoard, persistence: Any, tmp_path: Path) -> None:
    # TaskFlow's bug 2160070: the service failing while the conductor iterates the board must
    # not end run(); it pauses and looks again. The failure comes from the iteration, as a real
    # one does (iterjobs itself reads nothing).
    real_iterjobs, failed = board.iterjobs, threading.Event()

    def failing() -> Iterator[Any]:
        raise exc.JobFailure("simulated transient board failure")
        yield

    def flaky_iterjobs(*args: Any, **kwargs: Any) -> Iterator[Any]:
        jobs = real_iterjobs(*args, **kwargs)
        if failed.is_set():
            return jobs
        failed.set()
        return failing()

    board.iterjobs = flaky_iterjobs  # type: ignore[method-assign]
    job = post_flow(board, persistence, jobs_flows.steps,
                    store={"ledger": str(tmp_path / "ledger")})
    conductor = make("nonblocking", board, persistence, wait_timeout=0.1)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("job_consumed")
        assert conductor.dispatching
    assert failed.is_set() and job.state == states.COMPLETE


def test_an_ordinary_failure_is_consumed(board: JobBoard, persistence: Any) -> None:
    job = post_flow(board, persistence, jobs_flows.broken)
    conductor = make("blocking", board, persistence)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("job_consumed")
    assert job.state == states.COMPLETE and board.iter_trash() == []


def test_an_execution_failure_is_abandoned_and_counted(board_factory: BoardFactory,
                                                       persistence: Any) -> None:
    board = board_factory(max_attempts=2)
    job = post_flow(board, persistence, jobs_flows.unreachable)
    conductor = make("blocking", board, persistence)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("job_trashed")  # the second abandon sends it to the trash
        assert job.wait(timeout=10)
    assert [e for e, _ in events.seen if e.startswith("job_")] == [
        "job_abandoned", "job_abandoned", "job_trashed"]
    [trashed] = board.iter_trash()
    assert trashed.uuid == job.uuid and "abandoned or orphaned 2 times" in trashed.reason


def test_a_job_without_a_flow_is_trashed_with_the_reason(board: JobBoard,
                                                         persistence: Any) -> None:
    job = board.post("no-book", details={})
    conductor = make("blocking", board, persistence)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("job_trashed")
    [trashed] = board.iter_trash()
    assert trashed.uuid == job.uuid and "No book found" in trashed.reason


def test_stop_hands_a_running_job_back_without_counting_it(board: JobBoard, persistence: Any,
                                                           tmp_path: Path) -> None:
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    job = post_flow(board, persistence, jobs_flows.steps,
                    store={"ledger": str(ledger), "gate": str(gate), "gated_step": "step-2"})
    conductor = make("nonblocking", board, persistence)
    events = Events(conductor)
    thread = threading.Thread(target=conductor.run)
    thread.start()
    jobs_flows.wait_for_file(tmp_path / "gate.waiting")
    conductor.stop()
    gate.touch()  # step-2 (running) finishes; step-3 never starts
    assert conductor.wait(20)
    thread.join()
    assert [e for e, _ in events.seen][-1] == "job_abandoned"
    assert job.state == states.UNCLAIMED and job.attempts == 0
    assert jobs_flows.ledger_lines(ledger) == ["step-1", "step-2"]
    second = make("blocking", board, persistence, name="c2")
    later = Events(second)
    with running(second):
        later.wait_for("job_consumed")
    assert jobs_flows.ledger_lines(ledger) == ["step-1", "step-2", "step-3"]


def test_simultaneous_jobs_are_bounded(board: JobBoard, persistence: Any,
                                       tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    ledger = tmp_path / "ledger"
    jobs = [post_flow(board, persistence, jobs_flows.steps, factory_args=(1,), name=f"j{i}",
                      store={"gate": str(gate), "gated_step": "step-1", "ledger": str(ledger)})
            for i in range(3)]
    conductor = make("nonblocking", board, persistence, max_simultaneous_jobs=2)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("running_start", count=2)
        jobs_flows.wait_for_file(tmp_path / "gate.waiting")
        claimed = [j for j in jobs if j.state == states.CLAIMED]
        assert len(claimed) == 2
        gate.touch()
        events.wait_for("job_consumed", count=3)


def test_claims_are_kept_alive_while_a_job_runs_past_its_ttl(board_factory: BoardFactory,
                                                            persistence: Any) -> None:
    board = board_factory(claim_ttl=1.0)
    job = post_flow(board, persistence, jobs_flows.steps, factory_args=(1,),
                    store={"hold": 2.5})
    conductor = make("blocking", board, persistence)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("job_consumed")
    assert job.state == states.COMPLETE and board.iter_trash() == []
    assert [e for e, _ in events.seen].count("running_start") == 1


def test_conductors_are_visible_while_they_run(board_factory: BoardFactory,
                                               persistence: Any) -> None:
    board = board_factory()
    watcher = board_factory()
    conductor = make("blocking", board, persistence, name="visible")
    with running(conductor):
        deadline = time.monotonic() + 10  # registered as run() starts, on the conductor's thread
        while not watcher.iter_entities("conductor") and time.monotonic() < deadline:
            time.sleep(0.01)
        [entity] = watcher.iter_entities("conductor")
        assert entity.name.startswith("visible@") and entity.metadata["pid"] > 0
    assert watcher.iter_entities("conductor") == []


def test_a_consumed_jobs_logbook_can_be_deleted(board: JobBoard, persistence: Any) -> None:
    post_flow(board, persistence, jobs_flows.steps, factory_args=(1,))
    conductor = make("blocking", board, persistence, delete_logbook=True)
    events = Events(conductor)
    with running(conductor):
        events.wait_for("job_consumed")
    with contextlib.closing(persistence.get_connection()) as conn:
        assert [b.uuid for b in conn.get_logbooks()] == []


def test_secrets_in_details_stay_out_of_the_logs(board: JobBoard, persistence: Any,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    post_flow(board, persistence, jobs_flows.secretive, store={"password": "hunter2-s3cret"})
    conductor = make("blocking", board, persistence)
    events = Events(conductor)
    with caplog.at_level(logging.DEBUG), running(conductor):
        events.wait_for("job_consumed")
    assert "hunter2-s3cret" not in caplog.text
    assert "***" in caplog.text


def test_jobs_run_on_the_worker_based_engine(board: JobBoard, persistence: Any,
                                             tmp_path: Path) -> None:
    import uuid

    from flowengine.worker_based.worker import Worker

    exchange = f"conductor-{uuid.uuid4().hex[:8]}"
    worker = Worker(exchange, "jobs", tasks=[jobs_flows.__name__], transport="memory",
                    threads_count=2)
    serving = threading.Thread(target=worker.run, kwargs={"display_banner": False},
                               daemon=True)
    serving.start()
    assert worker.wait(30)
    ledger = tmp_path / "ledger"
    jobs = [post_flow(board, persistence, jobs_flows.steps, factory_args=(2,), name=f"j{i}",
                      store={"ledger": str(ledger)}) for i in range(2)]
    conductor = make("nonblocking", board, persistence, engine="worker-based",
                     engine_options={"exchange": exchange, "topics": ["jobs"],
                                     "transport": "memory"}, max_simultaneous_jobs=2)
    events = Events(conductor)
    try:
        with running(conductor):
            events.wait_for("job_consumed", count=2)
    finally:
        worker.stop(grace=5)
        serving.join(10)
    assert all(job.state == states.COMPLETE for job in jobs)
    assert sorted(jobs_flows.ledger_lines(ledger)) == ["step-1", "step-1", "step-2", "step-2"]
