"""run_iter, suspending, resuming in memory, and reset."""

from __future__ import annotations

import threading

import pytest

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf

from . import tasks

LOOP_STATES = {states.SCHEDULING, states.WAITING, states.ANALYZING}


def chain(*names: str):
    return lf.Flow("chain").add(*(tasks.Step(n) for n in names))


def run_until_executed(engine, atom: str) -> list[str]:
    """Iterate ``run_iter``, asking to suspend once ``atom`` has executed."""
    seen = []
    iterator = engine.run_iter()
    state = next(iterator)
    while True:
        seen.append(state)
        try:
            state = iterator.send(atom in tasks.names("execute"))
        except StopIteration:
            return seen


# ---- run_iter -----------------------------------------------------------------------------------


def test_run_iter_yields_the_engine_states_from_resuming_to_success(engine_factory):
    engine = engine_factory(chain("a", "b"))
    seen = list(engine.run_iter())
    assert seen[0] == states.RESUMING
    assert seen[-1] == states.SUCCESS
    assert set(seen[1:-1]) == LOOP_STATES
    # Each atom needs its own scheduling round in a linear flow.
    assert seen.count(states.SCHEDULING) >= 2
    assert tasks.names("execute") == ["a", "b"]


def test_run_iter_of_a_failing_flow_ends_in_reverted_then_raises(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Fail("boom")))
    seen = []
    with engine_factory.raises(tasks.Boom):
        for state in engine.run_iter():
            seen.append(state)
    assert seen[-1] == states.REVERTED
    assert engine.storage.get_flow_state() == states.REVERTED


def test_run_iter_runs_nothing_until_iterated(engine_factory):
    engine = engine_factory(chain("a"))
    iterator = engine.run_iter()
    assert tasks.entries() == []
    assert list(iterator)[-1] == states.SUCCESS


# ---- suspend and resume -------------------------------------------------------------------------


def test_sending_true_suspends_after_running_atoms_finish(engine_factory):
    engine = engine_factory(chain("a", "b", "c"))
    seen = run_until_executed(engine, "a")
    assert seen[-1] == states.SUSPENDED
    assert tasks.names("execute") == ["a"]
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert engine.storage.get_atom_state("a") == states.SUCCESS
    assert engine.storage.get_atom_state("b") == states.PENDING


def test_second_run_continues_a_suspended_flow_without_rerunning(engine_factory):
    flow = lf.Flow("f").add(
        tasks.Constant("one", provides="x", inject={"value": 2}),
        tasks.Scale("two", provides="y"),
        tasks.Add("three", rebind={"y": "y", "x": "x"}, provides="z"))
    engine = engine_factory(flow)
    run_until_executed(engine, "one")
    engine.run()
    assert tasks.names("execute") == ["one", "two", "three"]
    assert engine.storage.fetch("z") == 22
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_suspend_from_a_notification_callback(engine_factory):
    engine = engine_factory(chain("a", "b", "c"))

    def suspend_after_b(state, details):
        if details["task_name"] == "b":
            engine.suspend()

    engine.atom_notifier.register(states.SUCCESS, suspend_after_b)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert tasks.names("execute") == ["a", "b"]
    engine.atom_notifier.deregister(states.SUCCESS, suspend_after_b)
    engine.run()
    assert tasks.names("execute") == ["a", "b", "c"]


def test_closing_run_iter_early_suspends(engine_factory):
    engine = engine_factory(chain("a", "b"))
    iterator = engine.run_iter()
    for _state in iterator:
        if tasks.names("execute"):
            break
    iterator.close()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    engine.run()
    assert tasks.names("execute") == ["a", "b"]


def test_a_new_engine_resumes_from_the_flow_detail(engine_factory):
    first = engine_factory(chain("a", "b", "c"))
    run_until_executed(first, "a")
    detail = first.storage.flow_detail
    second = engines.load(chain("a", "b", "c"), flow_detail=detail, engine=engine_factory.kind,
                          **engine_factory.options)
    second.run()
    assert tasks.names("execute") == ["a", "b", "c"]
    assert second.storage.get_flow_state() == states.SUCCESS


def test_suspend_while_reverting_then_finish_reverting(engine_factory):
    flow = lf.Flow("f").add(tasks.Step("a"), tasks.Step("b"), tasks.Fail("boom"))
    engine = engine_factory(flow)

    def suspend_after_first_revert(state, details):
        if details["task_name"] == "boom":
            engine.suspend()

    engine.atom_notifier.register(states.REVERTED, suspend_after_first_revert)
    engine.run()  # a suspended engine does not raise
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert tasks.names("revert") == ["boom"]
    engine.atom_notifier.deregister(states.REVERTED, suspend_after_first_revert)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.names("revert") == ["boom", "b", "a"]
    assert tasks.names("execute") == ["a", "b", "boom"]
    assert engine.storage.get_flow_state() == states.REVERTED


def test_suspend_inside_a_retry_then_resume(engine_factory):
    from flowengine import retry

    flow = lf.Flow("r", retry=retry.Times(3, provides="attempt")).add(
        tasks.Step("a"), tasks.FailUntil("flaky", inject={"succeed_at": 2}))
    engine = engine_factory(flow)

    def suspend_on_failure(state, details):
        engine.suspend()

    engine.atom_notifier.register(states.FAILURE, suspend_on_failure)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    engine.atom_notifier.deregister(states.FAILURE, suspend_on_failure)
    engine.run()
    assert [e["attempt"] for e in tasks.entries("execute") if e["atom"] == "flaky"] == [1, 2]
    assert engine.storage.get_flow_state() == states.SUCCESS


# ---- reset --------------------------------------------------------------------------------------


def test_reset_runs_everything_again(engine_factory):
    engine = engine_factory.run(chain("a", "b"))
    engine.reset()
    assert engine.storage.get_flow_state() == states.PENDING
    assert engine.storage.get_atom_state("a") == states.PENDING
    assert engine.storage.get_atom_state("b") == states.PENDING
    engine.run()
    assert tasks.names("execute") == ["a", "b", "a", "b"]


def test_reset_of_a_suspended_flow_is_refused_as_in_taskflow(engine_factory):
    engine = engine_factory(chain("a", "b"))
    run_until_executed(engine, "a")
    with pytest.raises(exc.InvalidState, match="SUSPENDED"):
        engine.reset()


def test_running_a_reverted_flow_again_starts_over(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Fail("boom")))
    for _ in range(2):
        with engine_factory.raises(tasks.Boom):
            engine.run()
    assert tasks.names("execute") == ["a", "boom", "a", "boom"]
    assert engine.storage.get_flow_state() == states.REVERTED


def test_running_a_finished_flow_again_runs_nothing(engine_factory):
    engine = engine_factory.run(chain("a"))
    engine.run()
    assert tasks.names("execute") == ["a"]
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_a_running_engine_refuses_a_second_run_from_another_thread(engine_factory):
    gate = tasks.make_barrier("gate", 2)
    engine = engine_factory(lf.Flow("f").add(tasks.Rendezvous("held", inject={"barrier": "gate"})))
    running = threading.Event()
    engine.atom_notifier.register(states.RUNNING, lambda state, details: running.set())
    outcome: list = []
    runner = threading.Thread(target=lambda: outcome.append(engine.run() or "done"))
    runner.start()
    try:
        assert running.wait(timeout=5)
        with pytest.raises(exc.ExecutionFailure, match="locked"):
            engine.run()
    finally:
        gate.wait()
        runner.join(timeout=5)
    assert outcome == ["done"]
    assert tasks.names("passed-barrier") == ["held"]
