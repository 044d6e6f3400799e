"""Scenario programs written once and run unchanged under TaskFlow and under flowengine.

Each scenario builds a flow from the library it is given (``lib.lf``, ``lib.engines``, ...) and
the scenario tasks (``t``); ``compat_runner`` runs them. This module imports neither library, so
the test module can read ``SCENARIOS`` from it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

Build = Callable[[Any, Any], tuple]
#: What order is defined on every engine, so compared: "all" (what ran and every notification),
#: "ledger" (what ran; notifications are compared as sets) or "none" (everything as sets).
ORDERS = ("all", "ledger", "none")
#: name -> (build function, order)
SCENARIOS: dict[str, tuple[Build, str]] = {}
ENGINES = ("serial", "parallel")


def scenario(order: str = "all") -> Callable[[Build], Build]:
    assert order in ORDERS, order

    def register(build: Build) -> Build:
        SCENARIOS[build.__name__] = (build, order)
        return build
    return register


# ---- scenarios: each returns (flow, store, engine options[, drive(engine, ledger)]) ------------
# Without ``drive`` the engine runs once through ``run_iter``.


@scenario()
def linear_results(lib, t):
    flow = lib.lf.Flow("root").add(t.Constant("one", provides="x", inject={"value": 1}),
                                   t.Scale("scale", provides="y"),
                                   t.Add("sum", provides="total"))
    return flow, None, {}


@scenario(order="none")
def unordered_and_graph(lib, t):
    graph = lib.gf.Flow("g").add(t.Scale("late", rebind={"x": "mid"}, provides="out"),
                                 t.Add("mid", rebind=["a", "a"], provides="mid"))
    flow = lib.lf.Flow("root").add(lib.uf.Flow("u").add(t.Step("s1"), t.Step("s2")), graph)
    return flow, {"a": 2}, {}


@scenario()
def arguments(lib, t):
    flow = lib.lf.Flow("root").add(
        t.Add("rebind-dict", rebind={"x": "p", "y": "q"}, provides="r1"),
        t.Add("rebind-list", rebind=["q", "p"], provides="r2"),
        t.Add("injected", inject={"x": 100}, provides="r3"),
        t.Scale("optional-default", rebind={"x": "p"}, provides="r4"),
        t.Greeting("default-provides"),
        t.Constant("tuple", provides=("t1", "t2"), inject={"value": [1, 2]}),
        t.Constant("set", provides={"k1", "k2"}, inject={"value": {"k1": 1, "k2": 2, "k3": 3}}),
    )
    return flow, {"p": 1, "q": 2, "y": 3, "who": "ann"}, {}


@scenario()
def store_and_atom_provide_same_name(lib, t):
    flow = lib.lf.Flow("root").add(t.Constant("maker", provides="x", inject={"value": 5}),
                                   t.Scale("user", provides="out"))
    return flow, {"x": 1}, {}


def _decider_flow(lib, t, depth):
    a, b, c, d = t.Step("a"), t.Step("b"), t.Step("c"), t.Step("d")
    inner = lib.lf.Flow("inner").add(t.Step("e"))
    graph = lib.gf.Flow("g").add(a, b, c, d, inner)
    graph.link(a, b, decider=lambda history: history["a"] != "a", decider_depth=depth)
    graph.link(b, c)
    graph.link(c, d)
    graph.link(c, inner)
    return lib.lf.Flow("root").add(graph, t.Step("after")), None, {}


@scenario()
def decider_depth_all(lib, t):
    return _decider_flow(lib, t, lib.deciders.Depth.ALL)


@scenario(order="none")
def decider_depth_flow(lib, t):
    return _decider_flow(lib, t, lib.deciders.Depth.FLOW)


@scenario(order="none")
def decider_depth_neighbors(lib, t):
    return _decider_flow(lib, t, lib.deciders.Depth.NEIGHBORS)


@scenario(order="none")
def decider_depth_atom(lib, t):
    return _decider_flow(lib, t, "atom")


@scenario()
def decider_ignored_atom_gets_no_vote(lib, t):
    a, b, c = t.Step("a"), t.Step("b"), t.Step("c")
    graph = lib.gf.Flow("g").add(a, b, c)
    graph.link(a, b, decider=lambda history: False, decider_depth="ATOM")
    graph.link(b, c, decider=lambda history: False, decider_depth="ATOM")
    return graph, None, {}


@scenario(order="none")
def decider_into_subflow(lib, t):
    a = t.Step("a")
    sub = lib.lf.Flow("sub").add(t.Step("s1"), t.Step("s2"))
    graph = lib.gf.Flow("g").add(a, sub, t.Step("free"))
    graph.link(a, sub, decider=lambda history: False)
    return graph, None, {}


@scenario()
def targeted(lib, t):
    flow = lib.gf.TargetedFlow("tf")
    seed = t.Constant("seed", provides="x", inject={"value": 2})
    target = t.Scale("target", provides="y")
    flow.add(seed, target, t.Step("other"), t.Scale("down", rebind={"x": "y"}, provides="z"))
    flow.set_target(target)
    return flow, None, {}


@scenario()
def revert_in_reverse_order(lib, t):
    flow = lib.lf.Flow("root").add(
        t.Step("a"), t.Add("b", rebind={"x": "p", "y": "p"}, provides="b_out"),
        lib.lf.Flow("inner").add(t.Step("c"), t.Fail("boom")), t.Step("never"))
    return flow, {"p": 1}, {}


@scenario()
def revert_failure(lib, t):
    flow = lib.lf.Flow("root").add(t.Step("a"), t.RevertFails("bad-revert"), t.Fail("boom"))
    return flow, None, {}


@scenario(order="none")
def two_failures_at_once(lib, t):
    return lib.uf.Flow("u").add(t.Fail("f1"), t.Fail("f2")), None, {}


@scenario()
def times_succeeds_on_third(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.Times(3, provides="attempt")).add(
        t.Step("a"), t.FailUntil("flaky", inject={"succeed_at": 3}))
    return flow, None, {}


@scenario()
def times_exhausted(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.Times(2, provides="attempt")).add(
        t.Step("a"), t.Fail("boom"))
    return lib.lf.Flow("root").add(t.Step("outside"), flow), None, {}


@scenario()
def times_revert_all_nested(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.Times(2, revert_all=True, name="r-in")).add(
        t.Fail("boom"))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(3, name="r-out")).add(t.Step("a"), inner)
    return outer, None, {}


@scenario()
def times_revert_nested(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.Times(2, name="r-in")).add(t.Fail("boom"))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(3, name="r-out")).add(t.Step("a"), inner)
    return outer, None, {}


@scenario()
def nested_times_outer_retries_inner(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.Times(2, name="r-in")).add(
        t.FailUntil("flaky", rebind={"attempt": "outer_attempt"}, inject={"succeed_at": 2}))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(3, name="r-out",
                                                       provides="outer_attempt"))
    return outer.add(t.Step("a"), inner), None, {}


@scenario()
def retry_result_visible_after_its_flow(lib, t):
    retried = lib.lf.Flow("r", retry=lib.retry.Times(3, name="times", provides="attempt")).add(
        t.FailUntil("flaky", inject={"succeed_at": 2}))
    flow = lib.gf.Flow("root").add(retried, t.Scale("after", rebind={"x": "attempt"},
                                                    provides="scaled"))
    return flow, None, {}


@scenario()
def for_each(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.ForEach([1, 2, 3], provides="value")).add(
        t.FailOn("picky", inject={"bad": [1, 2]}))
    return flow, None, {}


@scenario()
def for_each_exhausted_revert_all(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.ForEach(["a", "b"], provides="value",
                                                         revert_all=True))
    inner.add(t.FailOn("picky", inject={"bad": ["a", "b"]}))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(3)).add(t.Step("first"), inner)
    return outer, None, {}


@scenario()
def parameterized_for_each(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.ParameterizedForEach(
        rebind={"values": "choices"}, provides="value"))
    flow.add(t.FailOn("picky", inject={"bad": ["x"]}))
    return flow, {"choices": ["x", "y", "z"]}, {}


@scenario()
def always_revert_defers_to_outer(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.AlwaysRevert("ar")).add(
        t.FailUntil("flaky", inject={"succeed_at": 2}))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(2, name="t", provides="attempt"))
    return outer.add(t.Step("a"), inner), None, {}


@scenario()
def always_revert_all_skips_outer(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.AlwaysRevertAll("ara")).add(t.Fail("boom"))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(5, name="t")).add(t.Step("a"), inner)
    return outer, None, {}


@scenario()
def defer_reverts(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.Times(2, name="r-in")).add(t.Fail("boom"))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(2, name="r-out")).add(t.Step("a"), inner)
    return outer, None, {"defer_reverts": True}


@scenario()
def never_resolve(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.Times(3)).add(t.Step("a"), t.Fail("boom"))
    return flow, None, {"never_resolve": True}


def double(x):
    return x * 2


def plus(a, b):
    return a + b


@scenario()
def functor_tasks(lib, t):
    flow = lib.lf.Flow("root").add(
        lib.task.FunctorTask(double, name="double", provides="d"),
        lib.task.MapFunctorTask(double, requires=["x", "d"], name="map", provides="mapped"),
        lib.task.ReduceFunctorTask(plus, requires=["x", "d"], name="reduce", provides="sum"))
    return flow, {"x": 3}, {}


_ONE_THREAD: list[concurrent.futures.ThreadPoolExecutor] = []


@scenario(order="ledger")
def priorities(lib, t):
    if not _ONE_THREAD:
        _ONE_THREAD.append(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    atoms = []
    for name, priority in (("low", 1), ("top", 9), ("zero", 0), ("mid", 5)):
        atom = t.Step(name)
        atom.priority = priority
        atoms.append(atom)
    # One thread: the parallel engine runs atoms in the order it submits them.
    return lib.uf.Flow("u").add(*atoms), None, {"executor": _ONE_THREAD[0]}


@scenario()
def retry_execute_fails(lib, t):
    class Broken(lib.retry.Times):
        def execute(self, history, *args, **kwargs):
            raise KeyError("retry broke")

    flow = lib.lf.Flow("r", retry=Broken(3, name="broken")).add(t.Step("a"))
    return lib.lf.Flow("root").add(t.Step("first"), flow), None, {}


@scenario()
def retry_on_failure_raises(lib, t):
    class Undecided(lib.retry.Times):
        def on_failure(self, history, *args, **kwargs):
            raise KeyError("cannot decide")

    flow = lib.lf.Flow("r", retry=Undecided(3, name="undecided")).add(t.Fail("boom"))
    return lib.lf.Flow("root").add(t.Step("first"), flow), None, {}


@scenario()
def missing_dependency(lib, t):
    return lib.lf.Flow("root").add(t.Add("needs-y", inject={"x": 1})), None, {}


@scenario()
def rebind_to_missing_name(lib, t):
    return lib.lf.Flow("root").add(t.Scale("s", rebind={"x": "nowhere"})), None, {}


@scenario()
def several_missing(lib, t):
    flow = lib.lf.Flow("root").add(t.Add("needs-x-y"), t.Scale("needs-x", rebind={"x": "w"}))
    return flow, None, {}


@scenario()
def consumer_before_producer(lib, t):
    flow = lib.lf.Flow("root").add(t.Scale("consumer"),
                                   t.Constant("producer", provides="x", inject={"value": 1}))
    return flow, None, {}


@scenario()
def unordered_sibling_dependency(lib, t):
    flow = lib.uf.Flow("u").add(t.Constant("producer", provides="x", inject={"value": 1}),
                                t.Scale("consumer"))
    return flow, None, {}


@scenario()
def same_atom_in_two_subflows(lib, t):
    shared = t.Step("shared")
    flow = lib.lf.Flow("root").add(lib.lf.Flow("a").add(shared), lib.lf.Flow("b").add(shared))
    return flow, None, {}


@scenario()
def duplicate_names(lib, t):
    return lib.lf.Flow("root").add(t.Step("same"), t.Step("same")), None, {}


@scenario()
def ambiguous_provider(lib, t):
    flow = lib.gf.Flow("g").add(t.Constant("p1", provides="x", inject={"value": 1}),
                                t.Constant("p2", provides="x", inject={"value": 2}))
    flow.add(t.Scale("user"))
    return flow, None, {}


@scenario()
def graph_cycle(lib, t):
    a, b = t.Step("a"), t.Step("b")
    flow = lib.gf.Flow("g").add(a, b)
    flow.link(a, b)
    flow.link(b, a)
    return flow, None, {}


@scenario()
def non_atom_item(lib, t):
    return lib.lf.Flow("root").add(t.Step("a"), "not an atom"), None, {}


@scenario()
def progress(lib, t):
    return lib.lf.Flow("root").add(t.Progress("p"), t.Step("a")), None, {}


def _suspend_once(engine, ledger, after):
    iterator = engine.run_iter()
    next(iterator)
    while True:
        try:
            iterator.send(any(e[:2] == ["execute", after] for e in ledger))
        except StopIteration:
            return


@scenario()
def suspend_and_resume(lib, t):
    def drive(engine, ledger):
        _suspend_once(engine, ledger, "a")
        ledger.append(["state", engine.storage.get_flow_state()])
        engine.run()

    flow = lib.lf.Flow("root").add(t.Step("a"), t.Step("b"), t.Step("c"))
    return flow, None, {}, drive


@scenario()
def suspend_while_reverting(lib, t):
    def drive(engine, ledger):
        def suspend(state, details):
            if details.get("task_name") == "boom":
                engine.suspend()
        engine.atom_notifier.register("REVERTED", suspend)
        engine.run()
        ledger.append(["state", engine.storage.get_flow_state()])
        engine.atom_notifier.deregister("REVERTED", suspend)
        engine.run()

    flow = lib.lf.Flow("root").add(t.Step("a"), t.Step("b"), t.Fail("boom"))
    return flow, None, {}, drive


@scenario()
def reset_and_run_again(lib, t):
    def drive(engine, ledger):
        engine.run()
        engine.reset()
        ledger.append(["state", engine.storage.get_flow_state()])
        engine.run()

    return lib.lf.Flow("root").add(t.Step("a"), t.Step("b")), None, {}, drive


@scenario()
def run_reverted_flow_again(lib, t):
    def drive(engine, ledger):
        try:
            engine.run()
        except RuntimeError:
            ledger.append(["state", engine.storage.get_flow_state()])
        engine.run()

    return lib.lf.Flow("root").add(t.Step("a"), t.Fail("boom")), None, {}, drive
