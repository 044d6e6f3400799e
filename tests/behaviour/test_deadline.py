"""A flow's deadline, on every engine: when it expires (by the engine's injected clock) the flow
is cancelled with reason "deadline"; it is stored, so a resumed flow keeps it."""

from __future__ import annotations

import pytest
from manual_clock import ManualClock

from flowengine import exceptions as exc
from flowengine import states
from flowengine.engines.stopping import META_CANCELLED, META_DEADLINE
from flowengine.flows import linear_flow as lf
from flowengine.persistence.backends import impl_memory
from flowengine.utils import persistence_utils as p_utils

from . import tasks
from .harness import EngineFactory
from .test_cancel import Background, _meet, five_steps, started_barrier

DEADLINE = 600.0


def test_an_expired_deadline_cancels_the_flow(engine_factory: EngineFactory) -> None:
    barrier = started_barrier()
    clock = ManualClock(start=1_000.0)
    engine = engine_factory(five_steps(barrier), deadline=DEADLINE, retry_clock=clock)
    run = Background(engine)
    _meet(barrier)
    assert engine.storage.flow_meta[META_DEADLINE] == {"at": 1_000.0 + DEADLINE,
                                                      "seconds": DEADLINE}
    clock.advance(DEADLINE - 1)
    engine.retry_waits.timer.check()
    assert engine.cancelled is None  # not yet
    clock.advance(1)
    engine.retry_waits.timer.check()
    error = run.join()

    assert isinstance(error, exc.FlowCancelled), error
    assert (error.reason, error.by) == ("deadline", "deadline")
    assert tasks.entries("stopped")[0]["reason"] == "deadline"
    assert tasks.names("revert") == ["t3", "t2", "t1"]
    assert tasks.names("execute") == ["t1", "t2", "t3"]
    assert engine.storage.get_flow_state() == states.REVERTED
    assert engine.storage.flow_meta[META_CANCELLED]["reason"] == "deadline"


def test_a_flow_done_in_time_is_not_cancelled(engine_factory: EngineFactory) -> None:
    clock = ManualClock(start=1_000.0)
    engine = engine_factory(lf.Flow("quick").add(tasks.Step("a"), tasks.Step("b")),
                            deadline=DEADLINE, retry_clock=clock)
    engine.run()
    clock.advance(DEADLINE * 2)
    engine.retry_waits.timer.check()  # the run ended: its deadline is disarmed
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert engine.cancelled is None
    assert tasks.names("revert") == []


def test_a_deadline_already_past_when_the_run_starts_cancels_it_at_once(
        engine_factory: EngineFactory) -> None:
    clock = ManualClock(start=1_000.0)
    backend = impl_memory.MemoryBackend()
    flow = lf.Flow("late").add(tasks.Step("a"), tasks.Step("b"))
    detail = p_utils.create_flow_detail(flow, backend=backend)
    engine = engine_factory(flow, flow_detail=detail, backend=backend, deadline=DEADLINE,
                            retry_clock=clock)
    for _state in engine.run_iter():
        engine.suspend()  # at once: nothing runs, but the run recorded its deadline
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert detail.meta[META_DEADLINE]["at"] == 1_000.0 + DEADLINE
    clock.advance(DEADLINE + 5)
    resumed = engine_factory(flow, flow_detail=detail, backend=backend, retry_clock=clock)
    with pytest.raises(exc.FlowCancelled, match="deadline"):
        resumed.run()  # the stored deadline holds, with no option given again
    assert tasks.names("execute") == []
    assert resumed.storage.get_flow_state() == states.REVERTED


@pytest.mark.parametrize("bad", [0, -3, "soon", True])
def test_a_bad_deadline_is_refused_naming_the_option(engine_factory: EngineFactory,
                                                     bad: object) -> None:
    with pytest.raises(ValueError, match="deadline"):
        engine_factory(lf.Flow("f").add(tasks.Step("a")), deadline=bad)
