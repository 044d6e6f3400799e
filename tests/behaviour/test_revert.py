"""Reverting: order, what revert receives, revert failures and several failures at once."""

from __future__ import annotations

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.flows import graph_flow as gf
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.types.failure import Failure

from . import tasks


def reverts(atom: str) -> dict:
    [entry] = [e for e in tasks.entries("revert") if e["atom"] == atom]
    return entry


def test_linear_flow_reverts_in_reverse_order_of_execution(engine_factory):
    flow = lf.Flow("root").add(
        tasks.Step("a"), tasks.Step("b"),
        lf.Flow("inner").add(tasks.Step("c"), tasks.Fail("boom")),
        tasks.Step("never"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom, match="boom failed"):
        engine.run()
    assert tasks.names("execute") == ["a", "b", "c", "boom"]
    assert tasks.names("revert") == ["boom", "c", "b", "a"]
    # Every revert starts after the last execute.
    assert min(e["seq"] for e in tasks.entries("revert")) > max(
        e["seq"] for e in tasks.entries("execute"))


def test_reverted_flow_states(engine_factory):
    flow = lf.Flow("root").add(tasks.Step("a"), tasks.Fail("boom"), tasks.Step("never"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    storage = engine.storage
    assert storage.get_flow_state() == states.REVERTED
    assert storage.get_atom_state("a") == states.REVERTED
    assert storage.get_atom_state("boom") == states.REVERTED
    assert storage.get_atom_state("never") == states.PENDING
    assert "never" not in tasks.names("revert")
    assert storage.get_revert_result("a") == "a undone"


def test_graph_flow_reverts_dependents_before_their_providers(engine_factory):
    tail, boom = tasks.Gather("tail", requires=["r"], provides="t"), tasks.Fail("boom")
    flow = gf.Flow("g").add(
        boom, tail,
        tasks.Scale("right", provides="r", rebind={"x": "l"}),
        tasks.Scale("left", provides="l"),
        tasks.Constant("root", provides="x", inject={"value": 1}),
    )
    flow.link(tail, boom)
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.names("execute") == ["root", "left", "right", "tail", "boom"]
    assert tasks.names("revert") == ["boom", "tail", "right", "left", "root"]


def test_unordered_siblings_are_all_reverted_before_their_predecessor(engine_factory):
    flow = lf.Flow("root").add(
        tasks.Step("first"),
        uf.Flow("u").add(tasks.Step("s1"), tasks.Step("s2"), tasks.Step("s3")),
        tasks.Fail("boom"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    reverted = tasks.names("revert")
    assert reverted[0] == "boom" and reverted[-1] == "first"
    assert sorted(reverted[1:4]) == ["s1", "s2", "s3"]


def test_revert_receives_the_execute_result(engine_factory):
    flow = lf.Flow("root").add(
        tasks.Constant("c", provides="x", inject={"value": {"made": 1}}), tasks.Fail("boom"))
    with engine_factory.raises(tasks.Boom):
        engine_factory.run(flow)
    assert reverts("c")["result"] == {"made": 1}


def test_failed_atom_reverts_with_its_own_failure_as_result(engine_factory):
    with engine_factory.raises(tasks.Boom):
        engine_factory.run(lf.Flow("root").add(tasks.Step("a"), tasks.Fail("boom")))
    assert reverts("boom")["result"] == {"failure": "boom failed"}


def test_revert_receives_flow_failures_naming_the_failed_atom(engine_factory):
    flow = lf.Flow("root").add(tasks.Step("a"), tasks.Fail("boom"))
    with engine_factory.raises(tasks.Boom):
        engine_factory.run(flow)
    assert reverts("a")["flow_failures"] == {"boom": "boom failed"}
    assert reverts("boom")["flow_failures"] == {"boom": "boom failed"}


def test_revert_receives_failure_objects(engine_factory):
    with engine_factory.raises(tasks.Boom):
        engine_factory.run(lf.Flow("root").add(tasks.InspectFailures("inspect"),
                                               tasks.Fail("boom")))
    assert reverts("inspect")["failures"] == {"boom": {
        "is_failure": True, "checks_as_boom": True, "checks_by_name": True,
        "message": "boom failed"}}


def test_revert_receives_the_same_rebound_arguments_as_execute(engine_factory):
    flow = lf.Flow("root").add(
        tasks.Add("sum", rebind={"x": "p", "y": "q"}, provides="total"), tasks.Fail("boom"))
    with engine_factory.raises(tasks.Boom):
        engine_factory.run(flow, store={"p": 1, "q": 2})
    assert reverts("sum")["args"] == {"x": 1, "y": 2}
    assert reverts("sum")["result"] == 3


def test_failed_atom_stores_a_failure_result(engine_factory):
    engine = engine_factory(lf.Flow("root").add(tasks.Fail("boom")))
    with engine_factory.raises(tasks.Boom):
        engine.run()
    failure = engine.storage.get("boom")
    assert isinstance(failure, Failure) and failure.check(tasks.Boom)


def test_revert_failure_stops_reverting_and_raises_the_revert_error(engine_factory):
    flow = lf.Flow("root").add(
        tasks.Step("before"), tasks.RevertFails("bad-revert"), tasks.Fail("boom"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.RevertBoom, match="bad-revert revert failed"):
        engine.run()
    storage = engine.storage
    assert storage.get_atom_state("bad-revert") == states.REVERT_FAILURE
    assert storage.get_atom_state("boom") == states.REVERTED
    assert storage.get_atom_state("before") == states.SUCCESS
    assert "before" not in tasks.names("revert")
    assert storage.get_flow_state() == states.FAILURE
    revert_failure = storage.get_revert_result("bad-revert")
    assert isinstance(revert_failure, Failure) and revert_failure.check(tasks.RevertBoom)


def test_linear_failure_stops_at_the_first_failing_atom(engine_factory):
    flow = lf.Flow("root").add(tasks.Fail("first"), tasks.Fail("second"))
    with engine_factory.raises(tasks.Boom, match="first failed"):
        engine_factory.run(flow)
    assert tasks.names("execute") == ["first"]


def test_two_failures_in_one_batch_raise_wrapped_failure(engine_factory):
    # TaskFlow starts every ready atom before looking at outcomes, on both engines.
    flow = uf.Flow("u").add(tasks.Fail("f1"), tasks.Fail("f2"))
    engine = engine_factory(flow)
    with pytest.raises(exc.WrappedFailure) as caught:
        engine.run()
    assert sorted(f.exception_str for f in caught.value) == ["f1 failed", "f2 failed"]
    assert caught.value.check(tasks.Boom) is tasks.Boom
    assert engine.storage.get_flow_state() == states.REVERTED


def test_a_single_failure_is_raised_as_itself_not_wrapped(engine_factory):
    # Not wrapped with anything else; a remote one is data, wrapped alone (see ``raises``).
    flow = uf.Flow("u").add(tasks.Step("fine"), tasks.Fail("only"))
    with engine_factory.raises(tasks.Boom, match="only failed"):
        engine_factory.run(flow)


def test_failure_deep_inside_nested_flows_reverts_everything(engine_factory):
    deep = lf.Flow("l3").add(tasks.Step("d1"), tasks.Fail("boom"))
    flow = lf.Flow("l1").add(
        tasks.Step("top"), uf.Flow("u2").add(tasks.Step("side"), deep), tasks.Step("never"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert set(tasks.names("revert")) == {"top", "side", "d1", "boom"}
    assert tasks.names("revert")[-1] == "top"
    assert engine.storage.get_flow_state() == states.REVERTED
