"""Cancelling a flow, on every engine: running tasks are asked to stop, what has not started
never runs, and what completed is reverted in reverse order; the flow ends REVERTED.

A task that polls its context (``UntilCancelled``) meets the test at a barrier, so the cancel
comes while it runs; the ledger says what each atom did, in order.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from flowengine import exceptions as exc
from flowengine import retry, states
from flowengine.engines.stopping import META_CANCELLED
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

from . import async_tasks, tasks
from .harness import EngineFactory

#: Seconds a background run may take to end once cancelled.
END_TIMEOUT = 30.0


class Background:
    """Runs an engine on a thread of its own; :meth:`join` re-raises what ``run`` raised."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="cancel-test-run")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.engine.run()
        except BaseException as err:
            self.error = err

    def join(self) -> BaseException | None:
        self._thread.join(END_TIMEOUT)
        assert not self._thread.is_alive(), "the cancelled run did not end"
        return self.error


def started_barrier() -> str:
    """The key of a new two-party barrier: the running task on one side, the test on the
    other (a function, not a fixture: the suite also runs on real brokers, where fixtures of
    this package do not reach)."""
    key = f"started-{uuid.uuid4().hex[:8]}"
    tasks.make_barrier(key, 2, timeout=tasks.CANCEL_PATIENCE)
    return key


def _meet(barrier: str) -> None:
    tasks._barriers.get(barrier).wait()


def _execute_failure(engine: Any, name: str) -> Any:
    """The failure stored for ``name``'s execute (the engine lists those of a cancelled flow's
    atoms among their revert's, as TaskFlow lists an atom's failure by its intention)."""
    detail = engine.storage.flow_detail.find(engine.storage.get_atom_uuid(name))
    assert detail.failure is not None, f"{name} did not fail"
    return detail.failure


def five_steps(barrier: str, raise_it: bool = False) -> lf.Flow:
    """t1, t2, then t3 running until cancelled, then t4 and t5."""
    return lf.Flow("five").add(
        tasks.Step("t1"), tasks.Step("t2"),
        tasks.UntilCancelled("t3", inject={"barrier": barrier, "raise_it": raise_it}),
        tasks.Step("t4"), tasks.Step("t5"))


def test_cancel_stops_the_running_task_and_reverts_in_reverse(
        engine_factory: EngineFactory) -> None:
    barrier = started_barrier()
    engine = engine_factory(five_steps(barrier))
    run = Background(engine)
    _meet(barrier)
    engine.cancel("operator changed their mind", by="a test")
    error = run.join()

    assert isinstance(error, exc.FlowCancelled), error
    assert error.reason == "operator changed their mind" and error.by == "a test"
    assert tasks.names("execute") == ["t1", "t2", "t3"]
    assert tasks.entries("stopped")[0]["reason"] == "operator changed their mind"
    assert tasks.names("revert") == ["t3", "t2", "t1"]
    storage = engine.storage
    assert storage.get_flow_state() == states.REVERTED
    assert [storage.get_atom_state(n) for n in ("t1", "t2", "t3", "t4", "t5")] == [
        states.REVERTED] * 3 + [states.PENDING] * 2
    record = storage.flow_meta[META_CANCELLED]
    assert (record["reason"], record["by"]) == ("operator changed their mind", "a test")
    assert record["at"].endswith("+00:00")


def test_a_task_that_raises_when_cancelled_is_reverted_and_never_retried(
        engine_factory: EngineFactory) -> None:
    barrier = started_barrier()
    controller = tasks.RecordingTimes(5, name="again")
    flow = lf.Flow("retried").add(tasks.Step("before"), lf.Flow("inner", retry=controller).add(
        tasks.UntilCancelled("looping", inject={"barrier": barrier, "raise_it": True})))
    engine = engine_factory(flow)
    run = Background(engine)
    _meet(barrier)
    engine.cancel("enough")
    assert isinstance(run.join(), exc.FlowCancelled)

    assert tasks.names("execute") == ["before", "looping"]
    assert tasks.names("retry-decision") == []  # a cancelled flow is never retried
    assert tasks.names("revert") == ["looping", "again", "before"]
    failure = _execute_failure(engine, "looping")
    assert failure.check("flowengine.exceptions.FlowCancelled")
    assert engine.storage.get_flow_state() == states.REVERTED


def test_a_cancel_before_the_run_runs_nothing(engine_factory: EngineFactory) -> None:
    engine = engine_factory(lf.Flow("never").add(tasks.Step("a"), tasks.Step("b")))
    engine.cancel("not needed after all")
    with pytest.raises(exc.FlowCancelled, match="not needed after all"):
        engine.run()
    assert tasks.entries() == []
    assert engine.storage.get_flow_state() == states.REVERTED
    assert [engine.storage.get_atom_state(n) for n in ("a", "b")] == [states.PENDING] * 2


def test_a_queued_task_never_starts_and_is_not_reverted(
        concurrent_engine_factory: EngineFactory) -> None:
    barrier = started_barrier()
    factory = concurrent_engine_factory
    busy = tasks.UntilCancelled("busy", inject={"barrier": barrier})
    busy.priority = 1  # dispatched first, so it takes the only thread
    flow = uf.Flow("queued").add(busy, tasks.Step("waiting"))
    engine = factory(flow, **factory.one_at_a_time())
    run = Background(engine)
    _meet(barrier)  # "busy" holds the only thread: "waiting" is queued behind it
    engine.cancel("drop it")
    assert isinstance(run.join(), exc.FlowCancelled)

    assert tasks.names("execute") == ["busy"]
    assert tasks.names("revert") == ["busy"]
    assert engine.storage.get_atom_state("waiting") == states.PENDING
    assert engine.storage.get_flow_state() == states.REVERTED


def test_an_async_task_is_interrupted_at_its_next_await(
        engine_factory: EngineFactory) -> None:
    barrier = started_barrier()
    flow = lf.Flow("awaiting").add(
        async_tasks.AsyncStep("first"),
        async_tasks.AsyncUntilCancelled("sleeper", inject={"barrier": barrier}),
        async_tasks.AsyncStep("never"))
    engine = engine_factory(flow)
    run = Background(engine)
    _meet(barrier)
    engine.cancel("interrupt it")
    assert isinstance(run.join(), exc.FlowCancelled)

    assert tasks.names("interrupted") == ["sleeper"]
    assert tasks.names("execute") == ["first", "sleeper"]
    assert tasks.names("revert") == ["sleeper", "first"]
    failure = _execute_failure(engine, "sleeper")
    assert "its flow is being cancelled" in failure.exception_str


def test_a_flow_whose_every_atom_succeeded_is_not_cancelled(
        engine_factory: EngineFactory) -> None:
    engine = engine_factory(lf.Flow("done").add(tasks.Step("only")))
    engine.run()
    engine.cancel("too late")
    engine.run()  # nothing left to run, and nothing is undone
    assert tasks.names("revert") == []
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert META_CANCELLED not in engine.storage.flow_meta
    assert engine.cancelled is None  # taken up (too late) by that run, not kept for another


def test_a_cancel_needs_a_reason(engine_factory: EngineFactory) -> None:
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a")))
    with pytest.raises(ValueError, match="non-empty reason"):
        engine.cancel("  ")


def test_a_retry_waiting_to_retry_is_reverted_not_retried(
        local_engine_factory: EngineFactory) -> None:
    from manual_clock import ManualClock

    clock = ManualClock()
    controller = retry.Times(3, name="patient", delay=60.0)
    flow = lf.Flow("waits").add(tasks.Step("before"), lf.Flow("inner", retry=controller).add(
        tasks.Fail("flaky")))
    engine = local_engine_factory(flow, retry_clock=clock)
    waiting = threading.Event()
    engine.retry_waits.subscribe(lambda wait: waiting.set() if wait.due else None)
    run = Background(engine)
    assert waiting.wait(END_TIMEOUT)  # the controller waits out its delay before attempt 2
    engine.cancel("stop waiting")
    assert isinstance(run.join(), exc.FlowCancelled)
    assert tasks.names("execute") == ["before", "flaky"]
    assert tasks.names("revert") == ["flaky", "before"]
    assert engine.storage.get_atom_state("patient") == states.REVERTED


def test_a_resumed_cancelled_flow_goes_on_reverting(engine_factory: EngineFactory) -> None:
    # The engine applied the cancel (stored with the flow), reverted t3, then its process died
    # with t2 still REVERTING: what a new engine finds.
    from flowengine.persistence.backends import impl_memory
    from flowengine.utils import persistence_utils as p_utils

    backend = impl_memory.MemoryBackend()
    flow = lf.Flow("died").add(tasks.Step("t1"), tasks.Step("t2"), tasks.Step("t3"),
                               tasks.Step("t4"))
    detail = p_utils.create_flow_detail(flow, backend=backend)
    first = engine_factory(flow, flow_detail=detail, backend=backend)
    for _state in first.run_iter():
        if first.storage.get_atom_state("t3") == states.SUCCESS:
            first.suspend()
    storage = first.storage
    assert storage.get_atom_state("t4") == states.PENDING
    storage.update_flow_metadata({META_CANCELLED: {"reason": "gone", "by": "ops",
                                                   "at": "2026-01-01T00:00:00+00:00"}})
    for name in ("t1", "t2", "t3"):
        storage.set_atom_intention(name, states.REVERT)
    storage.save("t3", "t3 undone", states.REVERTED)
    storage.set_atom_state("t2", states.REVERTING)
    storage.set_flow_state(states.RUNNING)
    tasks.clear()

    resumed = engine_factory(flow, flow_detail=detail, backend=backend)
    with pytest.raises(exc.FlowCancelled, match="gone"):
        resumed.run()
    assert tasks.names("revert") == ["t2", "t1"]
    assert tasks.names("execute") == []
    assert [resumed.storage.get_atom_state(n) for n in ("t1", "t2", "t3", "t4")] == [
        states.REVERTED] * 3 + [states.PENDING]
