"""Retry controllers, alone and nested, and their revert/revert_all decisions."""

from __future__ import annotations

import pytest

from flowengine import retry, states
from flowengine.flows import graph_flow as gf
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

from . import tasks


def attempts_of(atom: str, key: str = "attempt") -> list:
    return [e[key] for e in tasks.entries("execute") if e["atom"] == atom]


# ---- Times --------------------------------------------------------------------------------------


def test_times_retries_until_the_subflow_succeeds(engine_factory):
    flow = lf.Flow("r", retry=retry.Times(3, name="times", provides="attempt")).add(
        tasks.Step("before"), tasks.FailUntil("flaky", inject={"succeed_at": 3}))
    engine = engine_factory.run(flow)
    assert attempts_of("flaky") == [1, 2, 3]
    assert tasks.names("execute").count("before") == 3
    assert tasks.names("revert") == ["flaky", "before", "flaky", "before"]
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert engine.storage.fetch("attempt") == 3
    history = engine.storage.get_retry_history("times")
    assert list(history.provided_iter()) == [1, 2, 3]
    assert [sorted(dict(history.outcomes_iter(i))) for i in range(3)] == [["flaky"], ["flaky"], []]
    assert history.caused_by(tasks.Boom)


def test_times_exhausted_reverts_and_raises(engine_factory):
    flow = lf.Flow("r", retry=tasks.RecordingTimes(2, name="times", provides="attempt")).add(
        tasks.Step("a"), tasks.Fail("boom"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.names("execute") == ["a", "boom", "a", "boom"]
    decisions = [e["decision"] for e in tasks.entries("retry-decision")]
    assert decisions == ["RETRY", "REVERT"]
    assert tasks.names("revert")[-1] == "times"
    assert engine.storage.get_atom_state("times") == states.REVERTED
    assert engine.storage.get_flow_state() == states.REVERTED


def test_retry_only_reruns_its_own_subflow(engine_factory):
    retried = lf.Flow("retried", retry=retry.Times(3, provides="attempt")).add(
        tasks.FailUntil("flaky", inject={"succeed_at": 2}))
    flow = lf.Flow("root").add(tasks.Step("outside"), retried, tasks.Step("after"))
    engine_factory.run(flow)
    assert tasks.names("execute") == ["outside", "flaky", "flaky", "after"]
    assert "outside" not in tasks.names("revert")


def test_retry_in_a_graph_flow_reruns_only_the_atoms_it_controls(engine_factory):
    retried = gf.Flow("retried", retry=retry.Times(2, provides="attempt")).add(
        tasks.Scale("use", rebind={"x": "v"}, provides="out"),
        tasks.FailUntil("flaky", inject={"succeed_at": 2}),
        tasks.Constant("make", provides="v", inject={"value": 1}),
    )
    flow = uf.Flow("root").add(tasks.Step("independent"), retried)
    engine = engine_factory.run(flow)
    assert tasks.names("execute").count("independent") == 1
    assert tasks.names("execute").count("make") == 2
    assert attempts_of("flaky") == [1, 2]
    assert engine.storage.fetch("out") == 10


@pytest.mark.parametrize("revert_all", [False, True])
def test_nested_times_revert_or_revert_all(engine_factory, revert_all):
    inner = lf.Flow("inner", retry=retry.Times(2, name="r-in", revert_all=revert_all)).add(
        tasks.Fail("boom"))
    outer = lf.Flow("outer", retry=retry.Times(3, name="r-out")).add(tasks.Step("a"), inner)
    engine = engine_factory(outer)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    # REVERT defers to the outer retry, which retries; REVERT_ALL goes past it.
    assert tasks.names("execute").count("a") == (1 if revert_all else 3)
    assert tasks.names("execute").count("boom") == (2 if revert_all else 6)
    assert engine.storage.get_flow_state() == states.REVERTED
    # When the outer retry gives up too, TaskFlow reverts only the inner subflow (unless
    # defer_reverts is set); REVERT_ALL reverts everything.
    assert engine.storage.get_atom_state("a") == (
        states.REVERTED if revert_all else states.SUCCESS)
    assert engine.storage.get_atom_state("boom") == states.REVERTED


def test_outer_retry_retries_a_subflow_whose_own_retry_gave_up(engine_factory):
    inner = lf.Flow("inner", retry=retry.Times(2, name="r-in")).add(
        tasks.FailUntil("flaky", rebind={"attempt": "outer_attempt"},
                        inject={"succeed_at": 2}))
    outer = lf.Flow("outer", retry=retry.Times(3, name="r-out", provides="outer_attempt"))
    engine = engine_factory.run(outer.add(tasks.Step("a"), inner))
    assert attempts_of("flaky") == [1, 1, 2]
    assert tasks.names("execute").count("a") == 2
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_three_levels_of_retries(engine_factory):
    level3 = lf.Flow("l3", retry=retry.Times(2, name="r3", provides="a3")).add(
        tasks.FailUntil("flaky", rebind={"attempt": "a1"}, inject={"succeed_at": 2}))
    level2 = lf.Flow("l2", retry=retry.Times(1, name="r2")).add(tasks.Step("mid"), level3)
    level1 = lf.Flow("l1", retry=retry.Times(2, name="r1", provides="a1")).add(
        tasks.Step("top"), level2)
    engine = engine_factory.run(level1)
    assert attempts_of("flaky") == [1, 1, 2]
    assert tasks.names("execute").count("top") == 2
    assert engine.storage.get_flow_state() == states.SUCCESS


# ---- ForEach and ParameterizedForEach -----------------------------------------------------------


def test_for_each_tries_values_in_order_until_one_works(engine_factory):
    flow = lf.Flow("r", retry=retry.ForEach(["x", "y", "z"], name="each", provides="value"))
    flow.add(tasks.FailOn("picky", inject={"bad": ["x", "y"]}))
    engine = engine_factory.run(flow)
    assert attempts_of("picky", "value") == ["x", "y", "z"]
    assert engine.storage.get("picky") == "z"


@pytest.mark.parametrize("revert_all", [False, True])
def test_for_each_exhausted_nested(engine_factory, revert_all):
    inner = lf.Flow("inner", retry=retry.ForEach([1, 2], provides="value",
                                                 revert_all=revert_all))
    inner.add(tasks.FailOn("picky", inject={"bad": [1, 2]}))
    outer = lf.Flow("outer", retry=retry.Times(2, name="t")).add(tasks.Step("first"), inner)
    engine = engine_factory(outer)
    with engine_factory.raises(tasks.Boom, match="with 2"):
        engine.run()
    assert tasks.names("execute").count("first") == (1 if revert_all else 2)
    assert attempts_of("picky", "value") == ([1, 2] if revert_all else [1, 2, 1, 2])
    assert engine.storage.get_flow_state() == states.REVERTED


def test_parameterized_for_each_reads_values_from_storage(engine_factory):
    flow = lf.Flow("r", retry=retry.ParameterizedForEach(
        name="each", rebind={"values": "choices"}, provides="value"))
    flow.add(tasks.FailOn("picky", inject={"bad": [10]}))
    engine = engine_factory.run(flow, store={"choices": [10, 20, 30]})
    assert attempts_of("picky", "value") == [10, 20]
    assert engine.storage.fetch("value") == 20


@pytest.mark.parametrize("revert_all", [False, True])
def test_parameterized_for_each_exhausted_nested(engine_factory, revert_all):
    inner = lf.Flow("inner", retry=retry.ParameterizedForEach(
        name="each", provides="value", revert_all=revert_all))
    inner.add(tasks.FailOn("picky", inject={"bad": ["a", "b"]}))
    outer = lf.Flow("outer", retry=retry.Times(2, name="t")).add(tasks.Step("first"), inner)
    engine = engine_factory(outer, store={"values": ["a", "b"]})
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.names("execute").count("first") == (1 if revert_all else 2)


def test_for_each_nested_inside_for_each(engine_factory):
    inner = lf.Flow("inner", retry=retry.ForEach([1, 2], name="inner-each", provides="n"))
    inner.add(tasks.Gather("pair", requires=["letter", "n"], provides="pair"),
              tasks.FailOn("picky", rebind={"value": "pair"},
                           inject={"bad": [{"letter": "a", "n": 1}, {"letter": "a", "n": 2},
                                           {"letter": "b", "n": 1}]}))
    outer = lf.Flow("outer", retry=retry.ForEach(["a", "b"], name="outer-each",
                                                 provides="letter"))
    engine = engine_factory.run(outer.add(inner))
    assert [(v["letter"], v["n"]) for v in attempts_of("picky", "value")] == [
        ("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert engine.storage.get_flow_state() == states.SUCCESS


# ---- AlwaysRevert and AlwaysRevertAll -----------------------------------------------------------


def test_always_revert_alone_reverts_only_its_subflow(engine_factory):
    inner = lf.Flow("inner", retry=retry.AlwaysRevert("ar")).add(
        tasks.Step("b"), tasks.Fail("boom"))
    flow = lf.Flow("root").add(tasks.Step("a"), inner, tasks.Step("after"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.names("execute") == ["a", "b", "boom"]
    assert tasks.names("revert") == ["boom", "b"]
    assert engine.storage.get_atom_state("a") == states.SUCCESS
    assert engine.storage.get_flow_state() == states.REVERTED


def test_always_revert_defers_to_the_outer_retry(engine_factory):
    inner = lf.Flow("inner", retry=retry.AlwaysRevert("ar")).add(
        tasks.FailUntil("flaky", inject={"succeed_at": 2}))
    outer = lf.Flow("outer", retry=retry.Times(2, name="t", provides="attempt"))
    engine = engine_factory.run(outer.add(tasks.Step("a"), inner))
    assert attempts_of("flaky") == [1, 2]
    assert tasks.names("execute").count("a") == 2
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_always_revert_all_alone_reverts_the_whole_flow(engine_factory):
    inner = lf.Flow("inner", retry=retry.AlwaysRevertAll("ara")).add(
        tasks.Step("b"), tasks.Fail("boom"))
    flow = lf.Flow("root").add(tasks.Step("a"), inner, tasks.Step("after"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.names("revert") == ["boom", "b", "a"]
    assert engine.storage.get_atom_state("a") == states.REVERTED
    assert engine.storage.get_atom_state("after") == states.PENDING


def test_always_revert_all_reverts_everything_despite_the_outer_retry(engine_factory):
    inner = lf.Flow("inner", retry=retry.AlwaysRevertAll("ara")).add(tasks.Fail("boom"))
    outer = lf.Flow("outer", retry=retry.Times(5, name="t")).add(tasks.Step("a"), inner)
    engine = engine_factory(lf.Flow("root").add(tasks.Step("first"), outer))
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.names("execute") == ["first", "a", "boom"]
    assert tasks.names("revert") == ["boom", "a", "first"]
    assert engine.storage.get_atom_state("t") == states.REVERTED


def test_times_nested_inside_always_revert_all_retries_first(engine_factory):
    inner = lf.Flow("inner", retry=retry.Times(2, name="t", provides="attempt")).add(
        tasks.FailUntil("flaky", inject={"succeed_at": 2}))
    outer = lf.Flow("outer", retry=retry.AlwaysRevertAll("ara")).add(tasks.Step("a"), inner)
    engine = engine_factory.run(outer)
    assert attempts_of("flaky") == [1, 2]
    assert engine.storage.get_flow_state() == states.SUCCESS


# ---- retries that fail themselves ---------------------------------------------------------------


def test_a_retry_whose_execute_fails_reverts_the_flow(engine_factory):
    retried = lf.Flow("r", retry=tasks.BrokenRetry(3, name="broken")).add(tasks.Step("a"))
    engine = engine_factory(lf.Flow("root").add(tasks.Step("first"), retried))
    with pytest.raises(tasks.Boom, match="broken cannot start"):
        engine.run()
    assert tasks.names("execute") == ["first"]
    assert tasks.names("revert") == ["first"]
    assert engine.storage.get_atom_state("broken") == states.REVERTED
    assert engine.storage.get_atom_state("a") == states.PENDING


def test_a_retry_that_cannot_decide_fails_the_engine(engine_factory):
    retried = lf.Flow("r", retry=tasks.UndecidedRetry(3, name="undecided")).add(
        tasks.Fail("boom"))
    engine = engine_factory(lf.Flow("root").add(tasks.Step("first"), retried))
    with pytest.raises(tasks.RevertBoom, match="undecided cannot decide"):
        engine.run()
    assert tasks.names("revert") == []
    assert engine.storage.get_atom_state("boom") == states.FAILURE
    assert engine.storage.get_flow_state() == states.FAILURE


# ---- engine options -----------------------------------------------------------------------------


@pytest.mark.parametrize("defer_reverts", [False, True])
def test_defer_reverts_reverts_past_the_subflow(engine_factory, defer_reverts):
    inner = lf.Flow("inner", retry=retry.AlwaysRevert("ar")).add(tasks.Fail("boom"))
    flow = lf.Flow("root").add(tasks.Step("a"), inner)
    engine = engine_factory(flow, defer_reverts=defer_reverts)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    expected = states.REVERTED if defer_reverts else states.SUCCESS
    assert engine.storage.get_atom_state("a") == expected


def test_never_resolve_fails_without_asking_the_retry(engine_factory):
    flow = lf.Flow("r", retry=tasks.RecordingTimes(3, name="times")).add(
        tasks.Step("a"), tasks.Fail("boom"))
    engine = engine_factory(flow, never_resolve=True)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.entries("retry-decision") == []
    assert tasks.names("revert") == []
    assert engine.storage.get_atom_state("boom") == states.FAILURE
    assert engine.storage.get_flow_state() == states.FAILURE
