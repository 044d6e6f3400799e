"""Time limits on the local engines, with the worker-based engine's semantics.

``Task.time_limit`` (or the ``time_limits`` option, which overrides it) bounds one call of
``execute`` or ``revert``: past it the atom fails with TaskTimeLimitExceeded and the flow reverts
as for any failure; a call that still returns later has its result ignored. The watchdog itself
is tested with a manual clock; the engine cases use short real limits on calls that block on an
event until the test releases them (nothing sleeps to synchronise).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine import exceptions as exc
from flowengine import states, task
from flowengine.engines import executor as ex
from flowengine.engines.time_limits import Watchdog, parse_time_limits
from flowengine.flows import linear_flow as lf
from flowengine.types.failure import Failure

from . import tasks
from .harness import EngineFactory

#: Short enough to keep the suite fast, long enough that a quick call never reaches it.
LIMIT = 0.3

RELEASE = threading.Event()  # lets blocked calls return (late)
RETURNED = threading.Event()  # set when a blocked call has returned


@pytest.fixture(autouse=True)
def _release_blocked_calls() -> Iterator[None]:
    RELEASE.clear()
    RETURNED.clear()
    yield
    RELEASE.set()


class Blocks(task.Task):
    """Blocks until the test releases it; has a time limit of its own."""

    time_limit = LIMIT

    def execute(self) -> str:
        tasks.record("execute", self.name)
        RELEASE.wait(30)
        RETURNED.set()
        return "late"

    def revert(self, **kwargs: Any) -> None:
        tasks.record("revert", self.name, result=tasks._result_summary(kwargs["result"]))


class RevertBlocks(tasks.Step):
    """Executes at once; its revert blocks until released."""

    def revert(self, **kwargs: Any) -> str:
        tasks.record("revert", self.name)
        RELEASE.wait(30)
        RETURNED.set()
        return "late"


def test_a_call_past_its_time_limit_fails_the_atom_and_reverts(
        local_engine_factory: EngineFactory) -> None:
    flow = lf.Flow("limited").add(tasks.Step("a"), Blocks("slow"), tasks.Step("c"))
    engine = local_engine_factory(flow)
    with pytest.raises(exc.TaskTimeLimitExceeded,
                       match=r"Task 'slow' exceeded its time limit of 0.3s \(ran 0.\d+s\)"):
        engine.run()
    assert tasks.names("revert") == ["slow", "a"]
    assert "exceeded its time limit" in tasks.entries("revert")[0]["result"]["failure"]
    storage = engine.storage
    assert storage.get_flow_state() == states.REVERTED
    # The call cannot be killed: it returns later, and what it returns is ignored.
    with _late_outcome_dropped():
        RELEASE.set()
    assert storage.get_atom_state("slow") == states.REVERTED
    assert storage.get_flow_state() == states.REVERTED


@contextlib.contextmanager
def _late_outcome_dropped() -> Iterator[None]:
    """Wait, after the body, until a late outcome was logged as ignored (right after it)."""
    dropped = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "late outcome" in record.getMessage():
                dropped.set()

    logger = logging.getLogger("flowengine.engines.time_limits")
    handler, level = Seen(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
        assert dropped.wait(30), "the late outcome was never reported as ignored"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_engine_option_overrides_the_class_limit(local_engine_factory: EngineFactory) -> None:
    flow = lf.Flow("limited").add(tasks.Step("quick"), Blocks("slow"))
    # No limit for "slow" would hang; the option gives "quick" a limit it never reaches.
    engine = local_engine_factory(flow, time_limits={"slow": LIMIT / 2, "quick": 60})
    with pytest.raises(exc.TaskTimeLimitExceeded, match="time limit of 0.15s"):
        engine.run()
    assert engine.storage.get_atom_state("quick") == states.REVERTED


def test_a_revert_past_its_time_limit_is_a_revert_failure(
        local_engine_factory: EngineFactory) -> None:
    flow = lf.Flow("limited").add(RevertBlocks("undo"), tasks.Fail("boom"))
    engine = local_engine_factory(flow, time_limits={"undo": LIMIT})
    with pytest.raises(Exception) as raised:
        engine.run()
    assert "exceeded its time limit" in str(raised.value)
    assert engine.storage.get_atom_state("undo") == states.REVERT_FAILURE
    assert engine.storage.get_flow_state() == states.FAILURE


def test_tasks_without_limits_still_run_in_the_calling_thread_on_serial() -> None:
    seen: list[str] = []

    class Where(task.Task):
        def execute(self) -> None:
            seen.append(threading.current_thread().name)

    from flowengine import engines

    engines.run(lf.Flow("f").add(Where("here")), engine="serial")
    assert seen == [threading.current_thread().name]


# ---- the watchdog and the option, without an engine -----------------------------------------


def test_the_watchdog_fails_a_call_once_the_clock_passes_its_limit() -> None:
    clock = ManualClock()
    watchdog = Watchdog(clock)
    overdue, in_time = cf.Future(), cf.Future()
    try:
        watchdog.started(overdue, "slow", ex.EXECUTED, 5.0)
        watchdog.started(in_time, "quick", ex.REVERTED, 5.0)
        clock.advance(4.9)
        watchdog.check()
        assert not overdue.done()
        watchdog.finished(in_time)
        in_time.set_result((ex.REVERTED, "in time"))
        clock.advance(0.2)
        watchdog.check()
        outcome, failure = overdue.result(timeout=0)
        assert outcome == ex.EXECUTED and isinstance(failure, Failure)
        assert failure.check(exc.TaskTimeLimitExceeded)
        assert "ran 5.100s" in failure.exception_str
        assert in_time.result(timeout=0) == (ex.REVERTED, "in time")
    finally:
        watchdog.stop()


def test_a_late_outcome_does_not_replace_the_time_limit_failure() -> None:
    clock = ManualClock()
    executor = ex.SerialTaskExecutor(time_limits={"late": 1.0}, clock=clock)
    executor.start()
    release, running = threading.Event(), threading.Event()

    class Late(task.Task):
        def execute(self) -> str:
            running.set()  # the watchdog knows the call before it starts
            release.wait(30)
            return "late"

    def expire_when_running() -> None:
        assert running.wait(30)
        clock.advance(2.0)
        executor.watchdog.check()

    helper = threading.Thread(target=expire_when_running)
    helper.start()
    try:
        future = executor.execute_task(Late("late"), "uuid", {})
        outcome, failure = future.result(timeout=0)
        assert outcome == ex.EXECUTED and failure.check(exc.TaskTimeLimitExceeded)
    finally:
        release.set()
        helper.join()
        executor.stop()
    assert future.result()[1] is failure


@pytest.mark.parametrize("value", [{"a": 0}, {"a": -1}, {"a": "soon"}, ["a"], {"a": float("inf")}])
def test_bad_time_limits_are_refused_by_name(value: Any) -> None:
    with pytest.raises(ValueError, match="'time_limits'"):
        parse_time_limits(value)
