"""Engines that run independent atoms at the same time (barriers prove it; nothing sleeps)."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

from . import tasks


def meeting(key: str, names: list[str], cls=tasks.Rendezvous):
    """An unordered flow of atoms that can only finish if they all run at the same time."""
    return uf.Flow(key).add(*(cls(name, inject={"barrier": key}) for name in names))


def test_independent_atoms_run_at_the_same_time(concurrent_engine_factory):
    tasks.make_barrier("four", 4)
    engine = concurrent_engine_factory.run(meeting("four", ["a", "b", "c", "d"]))
    assert sorted(tasks.names("passed-barrier")) == ["a", "b", "c", "d"]
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_nested_unordered_flows_run_together(concurrent_engine_factory):
    tasks.make_barrier("nested", 3)
    flow = uf.Flow("outer").add(
        tasks.Rendezvous("top", inject={"barrier": "nested"}),
        lf.Flow("l").add(tasks.Step("first"),
                         uf.Flow("inner").add(tasks.Rendezvous("x", inject={"barrier": "nested"}),
                                              tasks.Rendezvous("y", inject={"barrier": "nested"}))))
    concurrent_engine_factory.run(flow)
    assert sorted(tasks.names("passed-barrier")) == ["top", "x", "y"]


def test_max_workers_in_an_engine_uri_limits_concurrency():
    tasks.make_barrier("two", 2)
    engine = engines.load(meeting("two", ["a", "b"]), engine="parallel://?max_workers=2")
    assert engine.options["max_workers"] == "2"  # as TaskFlow gives it: the URI's text
    engine.run()
    assert sorted(tasks.names("passed-barrier")) == ["a", "b"]

    # Three atoms cannot meet on two threads: the barrier breaks instead of letting them pass.
    tasks.make_barrier("three", 3, timeout=0.5)
    engine = engines.load(meeting("three", ["c", "d", "e"]), engine="parallel://?max_workers=2")
    with pytest.raises((threading.BrokenBarrierError, exc.WrappedFailure)) as caught:
        engine.run()
    assert not isinstance(caught.value, exc.WrappedFailure) or caught.value.check(
        threading.BrokenBarrierError)
    assert not {"c", "d", "e"} & set(tasks.names("passed-barrier"))


def test_caller_supplied_executor_is_used_and_not_shut_down():
    # A thread pool as ``executor`` is the parallel engine's option (the worker-based engine's
    # ``executor`` is a WorkerTaskExecutor, as in TaskFlow).
    with cf.ThreadPoolExecutor(max_workers=3, thread_name_prefix="caller-pool") as pool:
        for run in range(2):
            flow = uf.Flow("where").add(*(tasks.WhereAmI(f"w{run}{i}") for i in range(3)))
            engines.run(flow, engine="parallel", executor=pool)
        threads = [e["thread"] for e in tasks.entries("execute")]
        assert len(threads) == 6
        assert all(name.startswith("caller-pool") for name in threads), threads
        assert pool.submit(lambda: "still open").result(timeout=5) == "still open"


def test_caller_supplied_executor_runs_atoms_concurrently():
    tasks.make_barrier("pool", 3)
    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        engines.run(meeting("pool", ["a", "b", "c"]), engine="parallel", executor=pool)
    assert sorted(tasks.names("passed-barrier")) == ["a", "b", "c"]


def test_engine_own_threads_are_not_the_callers():
    engine = engines.load(tasks.WhereAmI("where"), engine="parallel", executor="threads")
    engine.run()
    assert engine.storage.get("where") != threading.current_thread().name


@pytest.mark.parametrize("bad", [
    lambda: {"max_workers": 0},
    lambda: {"max_workers": "many"},
    lambda: {"executor": "processes"},
    lambda: {"executor": cf.ProcessPoolExecutor(max_workers=1)},
], ids=["zero-workers", "word-workers", "executor-name", "process-pool"])
def test_bad_parallel_options_are_refused(bad):
    options = bad()
    try:
        with pytest.raises(ValueError):
            engines.load(tasks.Step("a"), engine="parallel", **options).run()
    finally:
        if isinstance(options.get("executor"), cf.Executor):
            options["executor"].shutdown()
    assert tasks.entries() == []


def test_several_failures_at_the_same_time_are_wrapped(concurrent_engine_factory):
    tasks.make_barrier("fail", 2)
    flow = lf.Flow("root").add(
        tasks.Step("before"), meeting("fail", ["f1", "f2"], tasks.RendezvousThenFail))
    engine = concurrent_engine_factory(flow)
    with pytest.raises(exc.WrappedFailure) as caught:
        engine.run()
    assert sorted(f.exception_str for f in caught.value) == ["f1 failed", "f2 failed"]
    assert engine.storage.get_flow_state() == states.REVERTED
    assert tasks.names("revert")[-1] == "before"


def test_one_failure_while_others_run_reverts_them_all(concurrent_engine_factory):
    tasks.make_barrier("mixed", 3)
    flow = uf.Flow("mixed").add(
        tasks.Rendezvous("ok1", inject={"barrier": "mixed"}),
        tasks.Rendezvous("ok2", inject={"barrier": "mixed"}),
        tasks.RendezvousThenFail("bad", inject={"barrier": "mixed"}))
    engine = concurrent_engine_factory(flow)
    with concurrent_engine_factory.raises(tasks.Boom):
        engine.run()
    assert sorted(tasks.names("revert")) == ["bad", "ok1", "ok2"]


def test_suspend_lets_running_atoms_finish_and_starts_nothing_new(concurrent_engine_factory):
    tasks.make_barrier("pair", 2)
    flow = lf.Flow("root").add(meeting("pair", ["a", "b"]), tasks.Step("after"))
    engine = concurrent_engine_factory(flow)

    def suspend_once_running(state, details):
        if details["task_name"] == "a":
            engine.suspend()

    engine.atom_notifier.register(states.RUNNING, suspend_once_running)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert sorted(tasks.names("passed-barrier")) == ["a", "b"]
    assert "after" not in tasks.names("execute")
    engine.atom_notifier.deregister(states.RUNNING, suspend_once_running)
    engine.run()
    assert tasks.names("execute")[-1] == "after"
    assert tasks.names("execute").count("a") == 1


def test_wide_flow_results_are_all_stored(concurrent_engine_factory):
    flow = uf.Flow("wide").add(*(tasks.Constant(f"c{i}", provides=f"v{i}",
                                                inject={"value": i}) for i in range(50)))
    engine = concurrent_engine_factory.run(flow, max_workers=8)
    assert engine.storage.fetch_all() == {f"v{i}": i for i in range(50)}

