"""``async def execute`` / ``revert``: awaited by every engine, never stored as coroutines.

The behaviour suite's core cases (order, results and arguments, reverting, what revert receives,
progress, retries, time limits) with async tasks on every engine; the parallel engine and a
worker await many of them at once on one event loop thread. The atoms live in
:mod:`.async_tasks`, which workers serve besides :mod:`.tasks`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from flowengine import engines, retry, states, task
from flowengine import exceptions as exc
from flowengine.engines import executor as ex
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

from . import tasks
from .async_tasks import (
    AsyncAdd,
    AsyncBlocks,
    AsyncFail,
    AsyncFlaky,
    AsyncProgress,
    AsyncStep,
    SlowCleanup,
    gates,
    wait_for_entry,
)
from .harness import EngineFactory


def test_async_tasks_run_in_order_and_pass_results(engine_factory: EngineFactory) -> None:
    flow = lf.Flow("f").add(AsyncAdd("one", provides="sum", inject={"y": 1}),
                            AsyncAdd("two", provides="total", rebind={"x": "sum"},
                                     inject={"y": 10}))
    engine = engine_factory.run(flow, store={"x": 5})
    assert engine.storage.fetch("total") == 16
    assert tasks.names("execute") == ["one", "two"]
    assert engine.storage.get_atom_state("two") == states.SUCCESS


def test_a_failing_async_task_reverts_with_async_reverts(engine_factory: EngineFactory) -> None:
    flow = lf.Flow("f").add(AsyncStep("a"), tasks.Step("b"), AsyncFail("boom"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom, match="boom failed"):
        engine.run()
    assert tasks.names("revert") == ["boom", "b", "a"]
    reverts = {e["atom"]: e for e in tasks.entries("revert")}
    assert reverts["a"]["result"] == "a" and reverts["a"]["flow_failures"] == ["boom"]
    assert reverts["boom"]["result"] == {"failure": "boom failed"}
    assert engine.storage.get_revert_result("a") == "a undone"
    assert engine.storage.get_flow_state() == states.REVERTED


def test_async_tasks_report_progress(engine_factory: EngineFactory) -> None:
    reported: list[float] = []
    progress = AsyncProgress("p")
    progress.notifier.register(task.EVENT_UPDATE_PROGRESS,
                               lambda event, details: reported.append(details["progress"]))
    engine = engine_factory.run(lf.Flow("f").add(progress))
    assert reported == [0.0, 0.5, 1.0]
    assert engine.storage.get("p") == "p"


def test_the_parallel_engine_awaits_many_async_tasks_at_once() -> None:
    # More tasks than threads: they take no pool thread, only loop slots.
    engine = engines.load(gates(200), engine="parallel", max_workers=2, max_async_tasks=200)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_async_tasks_take_no_thread(concurrent_engine_factory: EngineFactory) -> None:
    # One thread (the parallel engine's pool, one worker's): ten async tasks still meet.
    one_thread = concurrent_engine_factory.one_at_a_time()
    engine = concurrent_engine_factory.run(gates(10), **one_thread)
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_max_async_tasks_bounds_how_many_run_at_once() -> None:
    running, peak = 0, 0

    class Counted(task.Task):
        async def execute(self) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

    flow = uf.Flow("wide").add(*(Counted(f"c{i}") for i in range(12)))
    engines.run(flow, engine="parallel", max_async_tasks=3)
    assert peak == 3


def test_an_async_task_past_its_time_limit_is_cancelled(engine_factory: EngineFactory) -> None:
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), AsyncBlocks("slow")))
    with pytest.raises(Exception) as raised:  # noqa: PT011 - checked below
        engine.run()
    # Raised as is when the engine's clock decides, wrapped when the worker's reply is first.
    failures = (list(raised.value) if isinstance(raised.value, exc.WrappedFailure)
                else [raised.value])
    assert len(failures) == 1, failures
    assert "'slow' exceeded its time limit" in str(failures[0]), failures
    assert wait_for_entry("cancelled", "slow"), "the coroutine was never cancelled"
    assert tasks.names("revert") == ["a"]
    assert engine.storage.get_flow_state() == states.REVERTED


def test_a_timed_out_coroutine_finishes_its_cleanup_before_the_flow_reverts(
        engine_factory: EngineFactory) -> None:
    # The engine waits for the cancelled coroutine (its except/finally blocks) before it
    # reverts the steps before it, the two never overlap: a local engine awaits it, a worker
    # replies once it has run (lifecycle.CLEANUP_GRACE).
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), SlowCleanup("slow")))
    with engine_factory.raises(exc.TaskTimeLimitExceeded, match="'slow' exceeded its time limit"):
        engine.run()
    assert tasks.first_seq("cleaned up", "slow") < tasks.first_seq("revert", "a")
    assert engine.storage.get_flow_state() == states.REVERTED


class _IgnoresCancel(task.Task):
    """Swallows the cancel its time limit sends and goes on waiting (a badly written task);
    the second cancel, when its engine's event loop stops, ends it."""

    time_limit = 0.2

    async def execute(self) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            tasks.record("cancelled", self.name)
        await asyncio.sleep(60)


def test_a_coroutine_that_ignores_its_time_limit_does_not_hang_the_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "SHUTDOWN_GRACE", 0.1)
    flow = lf.Flow("f").add(tasks.Step("a"), _IgnoresCancel("stubborn"))
    engine = engines.load(flow, engine="serial")
    with pytest.raises(exc.TaskTimeLimitExceeded, match="'stubborn' exceeded"):
        engine.run()
    assert tasks.names("cancelled") == ["stubborn"]
    assert tasks.names("revert") == ["a"]
    assert engine.storage.get_flow_state() == states.REVERTED


def test_an_async_call_cancelled_before_it_starts_never_runs() -> None:
    # What a suspension does to atoms that have not started: their futures are cancelled.
    executor = ex.ParallelThreadTaskExecutor(max_async_tasks=1)
    executor.start()
    release = threading.Event()
    ran: list[str] = []

    class Holds(task.Task):
        async def execute(self) -> str:
            ran.append(self.name)
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
            return self.name

    class Queued(task.Task):
        async def execute(self) -> str:
            ran.append(self.name)
            return self.name

    try:
        holding = executor.execute_task(Holds("holds"), "u1", {})
        queued = executor.execute_task(Queued("queued"), "u2", {})
        assert queued.cancel(), "a call waiting for a slot can be cancelled"
        release.set()
        assert holding.result(timeout=30) == (ex.EXECUTED, "holds")
    finally:
        release.set()
        executor.stop()  # waits for the loop: the queued call had its turn by now
    assert ran == ["holds"]


def test_a_coroutine_cancelled_as_its_loop_stops_fails_naming_the_task() -> None:
    executor = ex.ParallelThreadTaskExecutor()
    executor.start()
    started = threading.Event()

    class Endless(task.Task):
        async def execute(self) -> None:
            started.set()
            await asyncio.sleep(60)

    future = executor.execute_task(Endless("endless"), "u1", {})
    try:
        assert started.wait(10), "the coroutine never started"
    finally:
        executor.stop()  # cancels what its loop still awaits
    outcome, failure = future.result(timeout=10)
    assert outcome == ex.EXECUTED
    assert failure.check(exc.ExecutionFailure), failure
    assert "'endless' was cancelled at an await: its engine's event loop stopped" in str(
        failure.exception)


def test_retry_controllers_retry_async_tasks(engine_factory: EngineFactory) -> None:
    flow = lf.Flow("f", retry=retry.Times(3)).add(AsyncFlaky("flaky", provides="out"))
    engine = engine_factory.run(flow)
    assert engine.storage.fetch("out") == "third time"
    assert tasks.names("execute") == ["flaky"] * 3


def test_suspending_between_async_tasks_resumes_where_it_stopped() -> None:
    class Suspender(task.Task):
        async def execute(self) -> str:
            return self.name

    flow = lf.Flow("f").add(Suspender("first"), AsyncStep("second"), AsyncStep("third"))
    engine = engines.load(flow, engine="parallel", max_async_tasks=1)

    def suspend_after_first(state: str, details: dict[str, Any]) -> None:
        if details.get("task_name") == "first":
            engine.suspend()

    engine.atom_notifier.register(states.SUCCESS, suspend_after_first)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert tasks.names("execute") == []
    engine.run()
    assert tasks.names("execute") == ["second", "third"]
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_engine_run_inside_a_running_event_loop(engine_factory: EngineFactory) -> None:
    async def service() -> Any:
        return engine_factory.run(lf.Flow("f").add(AsyncStep("a")))

    engine = asyncio.run(service())
    assert engine.storage.get("a") == "a"


def test_no_coroutine_is_ever_stored_as_a_result() -> None:
    class SyncReturnsCoroutine(task.Task):
        def execute(self) -> Any:
            return asyncio.sleep(0)

    engine = engines.load(lf.Flow("f").add(SyncReturnsCoroutine("odd")))
    with pytest.raises(TypeError, match="'odd' returned a coroutine; declare it async def"):
        engine.run()
