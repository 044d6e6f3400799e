"""Link deciders in graph flows: what each depth ignores, and what ignored atoms mean."""

from __future__ import annotations

import importlib

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.deciders import Depth
from flowengine.flows import graph_flow as gf
from flowengine.flows import linear_flow as lf

from . import tasks

EVERYONE = {"a", "b", "c", "d", "e", "after"}


def decided_flow(decider, depth=None):
    """root = [g, after]; g: a -decider-> b -> c -> d, and c -> inner flow [e]."""
    a, b, c, d = (tasks.Step(n) for n in "abcd")
    inner = lf.Flow("inner").add(tasks.Step("e"))
    graph = gf.Flow("g").add(a, b, c, d, inner)
    graph.link(a, b, decider=decider, decider_depth=depth)
    graph.link(b, c)
    graph.link(c, d)
    graph.link(c, inner)
    return lf.Flow("root").add(graph, tasks.Step("after"))


def never(history):
    return False


@pytest.mark.parametrize(
    ("depth", "ignored"),
    [
        (Depth.ALL, {"b", "c", "d", "e", "after"}),
        (Depth.FLOW, {"b", "c", "d"}),
        (Depth.NEIGHBORS, {"b", "c"}),
        (Depth.ATOM, {"b"}),
        (None, {"b", "c", "d", "e", "after"}),
    ],
    ids=["ALL", "FLOW", "NEIGHBORS", "ATOM", "default-is-ALL"],
)
def test_each_depth_ignores_its_reach_and_runs_the_rest(engine_factory, depth, ignored):
    engine = engine_factory.run(decided_flow(never, depth))
    assert set(tasks.names("execute")) == EVERYONE - ignored
    for name in EVERYONE:
        expected = states.IGNORE if name in ignored else states.SUCCESS
        assert engine.storage.get_atom_state(name) == expected, name
    assert engine.storage.get_flow_state() == states.SUCCESS


@pytest.mark.parametrize("depth", ["all", "Flow", "NEIGHBORS", "atom"])
def test_depth_may_be_given_by_name(engine_factory, depth):
    engine = engine_factory.run(decided_flow(never, depth))
    assert engine.storage.get_atom_state("b") == states.IGNORE
    assert engine.storage.get_atom_state("a") == states.SUCCESS


def test_unknown_depth_name_is_refused():
    a, b = tasks.Step("a"), tasks.Step("b")
    flow = gf.Flow("g").add(a, b)
    with pytest.raises(ValueError, match="sideways"):
        flow.link(a, b, decider=never, decider_depth="sideways")


def test_decider_that_agrees_runs_everything(engine_factory):
    engine = engine_factory.run(decided_flow(lambda history: True, Depth.ALL))
    assert set(tasks.names("execute")) == EVERYONE
    assert engine.storage.get_atom_state("b") == states.SUCCESS


def test_decider_sees_the_results_of_its_link_source(engine_factory):
    seen = []

    def decider(history):
        seen.append(dict(history))
        return history["source"] > 3

    source = tasks.Constant("source", provides="x", inject={"value": 5})
    guarded = tasks.Scale("guarded", provides="y")
    flow = gf.Flow("g").add(source, guarded)
    flow.link(source, guarded, decider=decider)
    engine = engine_factory.run(flow)
    assert seen == [{"source": 5}]
    assert engine.storage.fetch("y") == 50


def test_decider_with_several_sources_sees_all_of_them(engine_factory):
    seen = []

    def decider(history):
        seen.append(dict(history))
        return True

    one = tasks.Constant("one", inject={"value": 1})
    two = tasks.Constant("two", inject={"value": 2})
    last = tasks.Step("last")
    flow = gf.Flow("g").add(one, two, last)
    flow.link(one, last, decider=decider)
    flow.link(two, last, decider=decider)
    engine_factory.run(flow)
    assert seen and all(h == {"one": 1, "two": 2} for h in seen)


def test_one_nay_is_enough_and_the_widest_depth_wins(engine_factory):
    one, two = tasks.Step("one"), tasks.Step("two")
    target, follower = tasks.Step("target"), tasks.Step("follower")
    flow = gf.Flow("g").add(one, two, target, follower)
    flow.link(one, target, decider=lambda history: True, decider_depth="ATOM")
    flow.link(two, target, decider=never, decider_depth="ATOM")
    flow.link(target, follower)
    engine = engine_factory.run(flow)
    assert engine.storage.get_atom_state("target") == states.IGNORE
    assert engine.storage.get_atom_state("follower") == states.SUCCESS

    # Two nays of different depths: the wider one decides.
    one, two = tasks.Step("one"), tasks.Step("two")
    target, follower = tasks.Step("target"), tasks.Step("follower")
    flow = gf.Flow("g").add(one, two, target, follower)
    flow.link(one, target, decider=never, decider_depth="ATOM")
    flow.link(two, target, decider=never, decider_depth="ALL")
    flow.link(target, follower)
    engine = engine_factory.run(flow)
    assert engine.storage.get_atom_state("follower") == states.IGNORE


def test_an_ignored_atom_gets_no_vote(engine_factory):
    a, b, c = tasks.Step("a"), tasks.Step("b"), tasks.Step("c")
    flow = gf.Flow("g").add(a, b, c)
    flow.link(a, b, decider=never, decider_depth="ATOM")
    flow.link(b, c, decider=never, decider_depth="ATOM")
    engine = engine_factory.run(flow)
    assert tasks.names("execute") == ["a", "c"]
    assert engine.storage.get_atom_state("b") == states.IGNORE


def test_decider_on_a_link_into_a_subflow_ignores_the_subflow(engine_factory):
    a = tasks.Step("a")
    sub = lf.Flow("sub").add(tasks.Step("s1"), tasks.Step("s2"))
    flow = gf.Flow("g").add(a, sub, tasks.Step("free"))
    flow.link(a, sub, decider=never)
    engine = engine_factory.run(flow)
    assert sorted(tasks.names("execute")) == ["a", "free"]
    assert engine.storage.get_atom_state("s2") == states.IGNORE


def test_ignored_atoms_have_no_result_and_are_announced(engine_factory):
    engine = engine_factory(decided_flow(never, Depth.ATOM))
    announced = []
    engine.atom_notifier.register(
        states.IGNORE, lambda state, details: announced.append(details["task_name"]))
    engine.run()
    assert announced == ["b"]
    with pytest.raises(exc.NotFound, match="ignored"):
        engine.storage.get("b")


def test_consumer_of_an_ignored_optional_result_runs_with_its_default(engine_factory):
    source = tasks.Constant("source", provides="x", inject={"value": 2})
    maker = tasks.Constant("maker", provides="factor", inject={"value": 3})
    user = tasks.Scale("user", provides="out")
    flow = gf.Flow("g").add(source, maker, user)
    gate = tasks.Step("gate")
    flow.add(gate)
    flow.link(gate, maker, decider=never, decider_depth="ATOM")
    engine = engine_factory.run(flow)
    assert engine.storage.get_atom_state("maker") == states.IGNORE
    assert engine.storage.fetch("out") == 20


def test_reset_and_rerun_asks_the_decider_again(engine_factory):
    answers = iter([False, True])
    a, b = tasks.Step("a"), tasks.Step("b")
    flow = gf.Flow("g").add(a, b)
    flow.link(a, b, decider=lambda history: next(answers))
    engine = engine_factory.run(flow)
    assert engine.storage.get_atom_state("b") == states.IGNORE
    engine.reset()
    engine.run()
    assert engine.storage.get_atom_state("b") == states.SUCCESS
    assert tasks.names("execute") == ["a", "a", "b"]


def test_depth_is_a_str_enum_as_in_taskflow():
    tf_depth = importlib.import_module("taskflow.deciders").Depth  # a test dependency
    assert [d.value for d in Depth] == [d.value for d in tf_depth]
    for ours, theirs in zip(Depth, tf_depth):
        assert isinstance(ours, str)
        assert ours == theirs == ours.value
        assert (str(ours), f"{ours}", f"{ours:>10}") == (str(theirs), f"{theirs}", f"{theirs:>10}")
        assert Depth.translate(ours.value.lower()) is ours
        assert Depth.translate(ours.value.capitalize()) is ours
        assert Depth.translate(theirs) is ours
    assert {Depth.ALL: 1}["ALL"] == 1
