"""Many worker-based engines of one process share one broker client.

Real engines and a real worker over kombu's in-memory transport: every engine runs on its own
thread at the same time, and all of them reach the worker through the process's one client
(one reply queue, one consumer thread), which routes each reply to its engine by correlation id.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from behaviour import tasks
from behaviour.harness import InProcessWorker

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf
from flowengine.worker_based import client as bc
from flowengine.worker_based import pause
from flowengine.worker_based.executor import WorkerTaskExecutor

ENGINES = 24
#: Seconds every engine gets to finish.
RUN_TIMEOUT = 60.0


@pytest.fixture
def worker() -> Iterator[InProcessWorker]:
    worker = InProcessWorker(threads=4)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(autouse=True)
def ledger() -> Iterator[tasks.MemoryLedger]:
    previous = tasks.use_ledger(tasks.MemoryLedger())
    try:
        yield tasks.use_ledger(tasks.MemoryLedger())
    finally:
        tasks.use_ledger(previous)


def flow_for(i: int) -> Any:
    """start-i provides i, then two steps scale it: the result says whose replies it got."""
    return lf.Flow(f"flow-{i}").add(
        tasks.Constant(f"start-{i}", provides="x", inject={"value": i}),
        tasks.Scale(f"tens-{i}", provides="y", inject={"factor": 10}),
        tasks.Scale(f"hundreds-{i}", rebind={"x": "y"}, provides="total",
                    inject={"factor": 10}),
    )


def library_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("flowengine-")]


def run_all(loaded: list[Any]) -> dict[int, BaseException]:
    errors: dict[int, BaseException] = {}
    start = threading.Barrier(len(loaded))

    def run(i: int, engine: Any) -> None:
        start.wait(RUN_TIMEOUT)
        try:
            engine.run()
        except BaseException as err:  # noqa: BLE001 - reported per engine below
            errors[i] = err

    threads = [threading.Thread(target=run, args=(i, e)) for i, e in enumerate(loaded)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RUN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "an engine hung"
    return errors


def test_concurrent_engines_share_one_client_and_get_only_their_own_replies(
    worker: InProcessWorker,
) -> None:
    loaded = [engines.load(flow_for(i), engine="worker-based", **worker.engine_options())
              for i in range(ENGINES)]
    before = set(library_threads())
    peak: list[int] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.wait(0.01):
            peak.append(len(set(library_threads()) - before))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert run_all(loaded) == {}
    finally:
        watching.set()
        watcher.join()
    for i, engine in enumerate(loaded):
        assert engine.storage.get_flow_state() == states.SUCCESS
        assert engine.storage.fetch("total") == i * 100, f"engine {i} got another's reply"
    executed = tasks.names("execute")
    assert sorted(executed) == sorted(f"{step}-{i}" for i in range(ENGINES)
                                      for step in ("start", "tens", "hundreds"))
    shared = [c for c in bc.clients() if c.broker.exchange == worker.exchange]
    assert len(shared) == 1, "every engine of the process uses one client"
    # The client's consumer and dispatch threads, whatever the number of engines.
    assert max(peak, default=0) <= 4, f"library threads grew with the engines: {peak}"


def test_one_engine_failing_or_suspending_does_not_disturb_the_others(
    worker: InProcessWorker,
) -> None:
    failing = lf.Flow("failing").add(tasks.Step("f-1"), tasks.Fail("f-boom"))
    suspended_flow = lf.Flow("suspending").add(tasks.Step("s-1"), tasks.Step("s-2"))
    options = worker.engine_options()
    bad = engines.load(failing, engine="worker-based", **options)
    paused = engines.load(suspended_flow, engine="worker-based", **options)
    paused.atom_notifier.register(
        states.SUCCESS, lambda _state, details: (
            paused.suspend() if details.get("task_name") == "s-1" else None))
    good = [engines.load(flow_for(i), engine="worker-based", **options) for i in range(6)]

    errors = run_all([bad, paused, *good])

    # A remote task's failure comes back as data, wrapped (as in TaskFlow).
    assert set(errors) == {0} and isinstance(errors[0], exc.WrappedFailure)
    assert [f.check(tasks.Boom) for f in errors[0]] == [tasks.Boom]
    assert bad.storage.get_flow_state() == states.REVERTED
    assert paused.storage.get_flow_state() == states.SUSPENDED
    for i, engine in enumerate(good):
        assert engine.storage.get_flow_state() == states.SUCCESS
        assert engine.storage.fetch("total") == i * 100
    paused.run()  # resumes where it stopped, on the same client
    assert paused.storage.get_flow_state() == states.SUCCESS
    assert tasks.names("execute").count("s-1") == 1


def test_a_view_detached_from_the_client_gets_no_more_replies(worker: InProcessWorker) -> None:
    first = WorkerTaskExecutor("first", worker.exchange, [worker.topic], transport="memory")
    second = WorkerTaskExecutor("second", worker.exchange, [worker.topic], transport="memory")
    first.start()
    second.start()
    try:
        assert first.client is second.client
        assert second.wait_for_workers(1, timeout=RUN_TIMEOUT) == 0
        future = second.execute_task(tasks.Step("detached"), "atom-1", {})
        assert future.result(timeout=RUN_TIMEOUT)[1] == "detached"
    finally:
        first.stop()
        second.stop()
    assert first.client.views == 0


def test_a_lingering_client_closes_by_itself_and_the_next_engine_gets_a_new_one(
    worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bc, "LINGER", 0.0)
    executor = WorkerTaskExecutor("once", worker.exchange, [worker.topic], transport="memory")
    executor.start()
    client = executor.client
    executor.stop()
    assert client.proxy.wait_stopped(RUN_TIMEOUT), "an idle client must close"
    engine = engines.load(flow_for(7), engine="worker-based", **worker.engine_options())
    engine.run()
    assert engine.storage.fetch("total") == 700


def test_a_borrowed_client_is_the_engines_one_and_stays_open_while_borrowed(
    worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bc, "LINGER", 0.0)
    broker = bc.Broker(worker.exchange, transport="memory")
    with bc.borrowed(broker) as client:
        # An engine comes and goes meanwhile: its leaving must not close what is borrowed.
        executor = WorkerTaskExecutor("borrow", worker.exchange, [worker.topic],
                                      transport="memory")
        executor.start()
        assert executor.client is client
        executor.stop()
        with bc.borrowed(broker) as again:
            assert again is client
        assert not client.proxy.wait_stopped(0.3), "a borrowed client was closed"
        client.proxy.publish(pause.Pause(worker.topic, False, None), "nobody-listens",
                             declare_queue=True)
    assert client.proxy.wait_stopped(RUN_TIMEOUT), "an unused client must close"
    with bc.borrowed(broker) as later:
        assert later is not client, "a closed client was lent"


def test_broker_options_are_validated_where_they_are_built() -> None:
    with pytest.raises(ValueError, match="exchange"):
        bc.Broker("")
    with pytest.raises(TypeError, match="'url'"):
        bc.Broker("x", url=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown retry_options: interval_strat"):
        bc.Broker("x", retry_options={"interval_strat": 1})
    assert bc.Broker("x", transport="memory", transport_options={"a": 1}) == bc.Broker(
        "x", transport="memory", transport_options={"a": 1})


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_builds_its_own_client(worker: InProcessWorker) -> None:
    broker = bc.Broker(worker.exchange, transport="memory")
    parent = bc.client_for(broker)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        try:
            fresh = bc.clients() == [] and bc.client_for(broker) is not parent
            os._exit(0 if fresh else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bc.client_for(broker) is parent, "the parent keeps its own"
