"""Flow patterns (linear, unordered, graph, targeted) and nesting, on every engine."""

from __future__ import annotations

import threading

import pytest

from flowengine import engines, states
from flowengine.flows import graph_flow as gf
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

from . import tasks


def before(first: str, second: str) -> bool:
    return tasks.first_seq("execute", first) < tasks.first_seq("execute", second)


def test_linear_flow_runs_children_in_order(engine_factory):
    flow = lf.Flow("line").add(*(tasks.Step(f"s{i}") for i in range(6)))
    engine = engine_factory.run(flow)
    assert tasks.names("execute") == [f"s{i}" for i in range(6)]
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert all(engine.storage.get_atom_state(f"s{i}") == states.SUCCESS for i in range(6))


def test_unordered_flow_runs_every_child_once(engine_factory):
    flow = uf.Flow("bag").add(*(tasks.Step(f"s{i}") for i in range(8)))
    engine_factory.run(flow)
    assert sorted(tasks.names("execute")) == sorted(f"s{i}" for i in range(8))


def test_results_are_stored_under_provides(engine_factory):
    flow = lf.Flow("calc").add(
        tasks.Constant("one", provides="x", inject={"value": 1}),
        tasks.Constant("two", provides="y", inject={"value": 2}),
        tasks.Add("sum", provides="total"),
    )
    engine = engine_factory.run(flow)
    assert engine.storage.fetch("total") == 3
    assert engine.storage.get("sum") == 3
    assert engine.storage.fetch_all() == {"x": 1, "y": 2, "total": 3}


def test_engines_run_returns_everything_stored(engine_factory):
    flow = lf.Flow("calc").add(tasks.Add("sum", provides="total"))
    found = engines.run(flow, store={"x": 2, "y": 5}, engine=engine_factory.kind,
                        **engine_factory.options)
    assert found == {"x": 2, "y": 5, "total": 7}


def test_tasks_run_where_the_engine_puts_them(engine_factory):
    engine = engine_factory.run(tasks.WhereAmI("where"))
    thread = engine.storage.get("where")
    if engine_factory.remote:
        assert thread.startswith(engine_factory.task_threads), thread
    elif engine_factory.kind == "serial":
        assert thread == threading.current_thread().name
    else:
        assert thread != threading.current_thread().name


def test_a_single_task_can_be_run_without_a_flow(engine_factory):
    engine = engine_factory.run(tasks.Add("sum", provides="total"), store={"x": 1, "y": 1})
    assert engine.storage.fetch("total") == 2


def test_an_empty_flow_succeeds(engine_factory):
    engine = engine_factory.run(lf.Flow("nothing"))
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert tasks.entries() == []


def test_graph_flow_orders_by_data_not_by_add_order(engine_factory):
    flow = gf.Flow("g").add(
        tasks.Scale("last", rebind={"x": "mid"}, provides="out"),
        tasks.Add("middle", rebind={"x": "first", "y": "first"}, provides="mid"),
        tasks.Constant("start", provides="first", inject={"value": 2}),
    )
    engine = engine_factory.run(flow)
    assert tasks.names("execute") == ["start", "middle", "last"]
    assert engine.storage.fetch("out") == 40


def test_graph_flow_explicit_links_order_independent_atoms(engine_factory):
    a, b, c = tasks.Step("a"), tasks.Step("b"), tasks.Step("c")
    flow = gf.Flow("g").add(a, b, c)
    flow.link(c, b)
    flow.link(b, a)
    engine_factory.run(flow)
    assert tasks.names("execute") == ["c", "b", "a"]


def test_graph_flow_diamond(engine_factory):
    flow = gf.Flow("diamond").add(
        tasks.Constant("top", provides="x", inject={"value": 3}),
        tasks.Scale("left", provides="l", inject={"factor": 2}),
        tasks.Scale("right", provides="r", inject={"factor": 5}),
        tasks.Add("bottom", rebind={"x": "l", "y": "r"}, provides="out"),
    )
    engine = engine_factory.run(flow)
    assert engine.storage.fetch("out") == 21
    assert before("top", "left") and before("top", "right")
    assert before("left", "bottom") and before("right", "bottom")


def test_nesting_four_levels_keeps_every_ordering(engine_factory):
    inner_line = lf.Flow("l3").add(tasks.Step("l3a"), tasks.Step("l3b"))
    bag = uf.Flow("u2").add(inner_line, tasks.Step("u2a"), tasks.Step("u2b"))
    graph = gf.Flow("g1").add(
        tasks.Constant("seed", provides="x", inject={"value": 1}),
        tasks.Scale("grow", provides="grown"),
    )
    root = lf.Flow("root").add(tasks.Step("first"), graph, bag, tasks.Step("last"))
    engine = engine_factory.run(root)
    executed = tasks.names("execute")
    assert sorted(executed) == sorted(
        ["first", "seed", "grow", "l3a", "l3b", "u2a", "u2b", "last"])
    assert executed[0] == "first" and executed[-1] == "last"
    assert before("seed", "grow") and before("l3a", "l3b")
    for name in ("l3a", "u2a", "u2b"):
        assert before("grow", name)
    assert engine.storage.fetch("grown") == 10


def test_nested_flows_see_outer_results_and_outer_sees_inner(engine_factory):
    inner = lf.Flow("inner").add(
        lf.Flow("deeper").add(tasks.Scale("deep", provides="deep_out")))
    root = lf.Flow("root").add(
        tasks.Constant("outer", provides="x", inject={"value": 4}),
        inner,
        tasks.Add("after", rebind={"x": "deep_out", "y": "x"}, provides="total"),
    )
    engine = engine_factory.run(root)
    assert engine.storage.fetch("total") == 44


def test_targeted_flow_runs_only_the_target_and_its_dependencies(engine_factory):
    flow = gf.TargetedFlow("targeted")
    seed = tasks.Constant("seed", provides="x", inject={"value": 2})
    target = tasks.Scale("target", provides="scaled")
    unrelated = tasks.Step("unrelated")
    downstream = tasks.Scale("downstream", rebind={"x": "scaled"}, provides="twice")
    flow.add(seed, target, unrelated, downstream)
    flow.set_target(target)
    engine = engine_factory.run(flow)
    assert tasks.names("execute") == ["seed", "target"]
    assert engine.storage.fetch("scaled") == 20


def test_targeted_flow_reset_target_runs_everything(engine_factory):
    flow = gf.TargetedFlow("targeted")
    seed = tasks.Constant("seed", provides="x", inject={"value": 2})
    target = tasks.Scale("target", provides="scaled")
    flow.add(seed, target, tasks.Step("unrelated"))
    flow.set_target(seed)
    flow.reset_target()
    engine_factory.run(flow)
    assert sorted(tasks.names("execute")) == ["seed", "target", "unrelated"]


def test_targeted_flow_rejects_a_target_it_does_not_hold():
    flow = gf.TargetedFlow("targeted").add(tasks.Step("inside"))
    with pytest.raises(ValueError, match="outside"):
        flow.set_target(tasks.Step("outside"))


def test_ready_atoms_start_in_priority_order(engine_factory):
    atoms = []
    for name, priority in (("low", 1), ("top", 9), ("zero", 0), ("mid", 5)):
        atom = tasks.Step(name)
        atom.priority = priority
        atoms.append(atom)
    # One thread (or a one-thread worker) runs atoms in the order the engine starts them.
    engine_factory.run(uf.Flow("u").add(*atoms), **engine_factory.one_at_a_time())
    assert tasks.names("execute") == ["top", "mid", "low", "zero"]
