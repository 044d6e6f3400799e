"""Flows that cannot run: each is refused with an error naming what is wrong."""

from __future__ import annotations

import pytest

from flowengine import engines, retry, states
from flowengine import exceptions as exc
from flowengine.flows import graph_flow as gf
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

from . import tasks

# ---- missing and ambiguous dependencies ---------------------------------------------------------


def test_missing_dependency_names_the_atom_and_the_name(engine_factory):
    engine = engine_factory(lf.Flow("root").add(tasks.Add("needs-y", inject={"x": 1})))
    with pytest.raises(exc.MissingDependencies) as caught:
        engine.run()
    message = str(caught.value)
    assert "needs-y" in message and "'y'" in message
    assert tasks.entries() == []
    assert engine.storage.get_atom_state("needs-y") == states.PENDING


def test_validate_reports_missing_dependencies_before_running(engine_factory):
    engine = engine_factory(lf.Flow("root").add(tasks.Step("fine"), tasks.Scale("needs-x")))
    engine.compile()
    engine.prepare()
    with pytest.raises(exc.MissingDependencies, match="needs-x"):
        engine.validate()
    assert tasks.entries() == []


def test_several_missing_dependencies_are_all_named(engine_factory):
    flow = lf.Flow("root").add(tasks.Add("needs-x-y"), tasks.Scale("s", rebind={"x": "w"}))
    with pytest.raises(exc.MissingDependencies) as caught:
        engine_factory.run(flow)
    message = str(caught.value)
    for name in ("'w'", "'x'", "'y'", "needs-x-y", "root"):
        assert name in message


def test_rebind_to_a_name_nothing_provides(engine_factory):
    flow = lf.Flow("root").add(tasks.Scale("scaler", rebind={"x": "nowhere"}))
    with pytest.raises(exc.MissingDependencies) as caught:
        engine_factory.run(flow, store={"x": 1})
    assert "'nowhere'" in str(caught.value) and "scaler" in str(caught.value)


def test_store_given_later_satisfies_what_was_missing(engine_factory):
    engine = engine_factory(lf.Flow("root").add(tasks.Scale("s", provides="out")))
    with pytest.raises(exc.MissingDependencies):
        engine.validate()
    engine.storage.inject({"x": 3})
    engine.run()
    assert engine.storage.fetch("out") == 30


def test_consumer_before_its_producer_in_a_linear_flow(engine_factory):
    flow = lf.Flow("root").add(
        tasks.Scale("consumer"), tasks.Constant("producer", provides="x", inject={"value": 1}))
    with pytest.raises(exc.MissingDependencies, match="consumer"):
        engine_factory.run(flow)


def test_unordered_siblings_cannot_feed_each_other(engine_factory):
    flow = uf.Flow("u").add(
        tasks.Constant("producer", provides="x", inject={"value": 1}), tasks.Scale("consumer"))
    with pytest.raises(exc.MissingDependencies, match="consumer"):
        engine_factory.run(flow)


def test_ambiguous_providers_in_a_graph_flow():
    flow = gf.Flow("g").add(
        tasks.Constant("p1", provides="x", inject={"value": 1}),
        tasks.Constant("p2", provides="x", inject={"value": 2}))
    with pytest.raises(exc.AmbiguousDependency) as caught:
        flow.add(tasks.Scale("user"))
    for name in ("p1", "p2", "user", "'x'"):
        assert name in str(caught.value)
    assert "user" not in [item.name for item in flow]


# ---- structure ----------------------------------------------------------------------------------


def test_duplicate_atom_names_are_refused(engine_factory):
    flow = lf.Flow("root").add(tasks.Step("same"), lf.Flow("inner").add(tasks.Step("same")))
    with pytest.raises(exc.Duplicate, match="same"):
        engine_factory.run(flow)
    assert tasks.entries() == []


def test_same_atom_object_in_two_subflows_is_refused(engine_factory):
    shared = tasks.Step("shared")
    flow = lf.Flow("root").add(lf.Flow("a").add(shared), lf.Flow("b").add(shared))
    with pytest.raises(exc.Duplicate, match="shared"):
        engine_factory.run(flow)


def test_same_atom_object_twice_is_a_value_error_as_in_taskflow(engine_factory):
    shared = tasks.Step("shared")
    flow = lf.Flow("root").add(lf.Flow("a").add(shared), lf.Flow("b").add(shared))
    with pytest.raises(ValueError):
        engine_factory.run(flow)


def test_explicit_links_forming_a_cycle_are_refused():
    a, b, c = tasks.Step("a"), tasks.Step("b"), tasks.Step("c")
    flow = gf.Flow("g").add(a, b, c)
    flow.link(a, b)
    flow.link(b, c)
    with pytest.raises(exc.DependencyFailure) as caught:
        flow.link(c, a)
    assert "'c'" in str(caught.value) and "'a'" in str(caught.value)
    assert len(list(flow.iter_links())) == 2


def test_data_dependencies_forming_a_cycle_are_refused():
    flow = gf.Flow("g")
    with pytest.raises(exc.DependencyFailure, match="cycle"):
        flow.add(tasks.Scale("a", rebind={"x": "y"}, provides="x"),
                 tasks.Scale("b", provides="y"))
    assert len(flow) == 0


def test_a_self_link_is_a_cycle():
    a = tasks.Step("a")
    with pytest.raises(exc.DependencyFailure):
        gf.Flow("g").add(a).link(a, a)


@pytest.mark.parametrize("pattern", [lf.Flow, uf.Flow], ids=["linear", "unordered"])
def test_flows_nested_in_each_other_are_a_value_error_naming_them(engine_factory, pattern):
    outer = pattern("outer")
    outer.add(uf.Flow("middle").add(lf.Flow("inner").add(tasks.Step("step"), outer)))
    with pytest.raises(ValueError, match=r"'outer' contains itself \('outer' -> 'middle' -> "
                                         r"'inner' -> 'outer'\)"):
        engine_factory.run(outer)
    assert tasks.entries() == []


def test_graph_flow_refuses_a_flow_that_contains_it_when_added():
    outer = gf.Flow("outer").add(tasks.Step("first"))
    middle = uf.Flow("middle").add(lf.Flow("inner").add(outer))
    with pytest.raises(ValueError, match="'outer' cannot contain 'middle', which contains it"):
        outer.add(tasks.Step("second"), middle)
    assert [item.name for item in outer] == ["first"]


@pytest.mark.parametrize("pattern", [lf.Flow, uf.Flow, gf.Flow], ids=["linear", "unordered",
                                                                      "graph"])
def test_a_flow_cannot_be_added_to_itself(pattern):
    flow = pattern("selfish")
    with pytest.raises(ValueError, match="'selfish' cannot contain itself"):
        flow.add(tasks.Step("fine"), flow)


@pytest.mark.parametrize("pattern", [lf.Flow, uf.Flow, gf.Flow], ids=["linear", "unordered",
                                                                      "graph"])
@pytest.mark.parametrize("item", ["a string", 42, None, object()],
                         ids=["a-string", "42", "None", "an-object"])  # the same in every process
def test_non_atom_items_are_refused_naming_the_flow(pattern, item):
    with pytest.raises(TypeError, match="named-flow"):
        pattern("named-flow").add(tasks.Step("fine"), item)


def test_link_to_a_node_outside_the_flow_is_refused():
    inside = tasks.Step("inside")
    flow = gf.Flow("g").add(inside)
    with pytest.raises(ValueError, match="g"):
        flow.link(inside, tasks.Step("outside"))


def test_retry_that_is_not_a_retry_is_refused(engine_factory):
    flow = lf.Flow("root", retry=tasks.Step("not-a-retry")).add(tasks.Step("a"))
    with pytest.raises(TypeError):
        engine_factory.run(flow)


def test_unknown_engine_is_named():
    with pytest.raises(exc.NotFound, match="warp-drive"):
        engines.load(lf.Flow("root"), engine="warp-drive")


# ---- results that do not match what the atom provides -------------------------------------------


@pytest.mark.parametrize(
    ("provides", "value"),
    [(("a", "b"), [1]), (("a", "b"), 5), ({"k"}, {"j": 1}), ({"k"}, [1, 2])],
    ids=["short-list", "scalar-for-tuple", "missing-key", "list-for-keys"],
)
def test_result_shape_mismatch_fails_the_atom_and_reverts(engine_factory, provides, value):
    flow = lf.Flow("root").add(
        tasks.Step("before"),
        tasks.Constant("misshapen", provides=provides, inject={"value": value}),
        tasks.Step("never"))
    engine = engine_factory(flow)
    with pytest.raises(exc.InvalidFormat, match="misshapen"):
        engine.run()
    assert tasks.names("execute") == ["before", "misshapen"]
    assert tasks.names("revert") == ["misshapen", "before"]
    # The task did its work: its revert gets what execute returned, to undo that work.
    [undone] = [e for e in tasks.entries("revert") if e["atom"] == "misshapen"]
    assert undone["result"] == value
    assert list(undone["flow_failures"]) == ["misshapen"]
    assert engine.storage.get_atom_state("misshapen") == states.REVERTED
    assert engine.storage.get_flow_state() == states.REVERTED


def test_result_shape_mismatch_is_retried_like_any_failure(engine_factory):
    flow = lf.Flow("r", retry=tasks.RecordingTimes(2, name="times")).add(
        tasks.Constant("misshapen", provides=("a", "b"), inject={"value": [1]}))
    with pytest.raises(exc.InvalidFormat):
        engine_factory.run(flow)
    assert tasks.names("execute") == ["misshapen", "misshapen"]
    assert [e["decision"] for e in tasks.entries("retry-decision")] == ["RETRY", "REVERT"]


def test_a_later_attempt_that_raises_reverts_with_its_own_failure(engine_factory):
    flow = lf.Flow("r", retry=retry.ForEach([[1], 2], name="values", provides="value")).add(
        tasks.FailOn("misshapen", provides=("a", "b"), inject={"bad": [2]}))
    with engine_factory.raises(tasks.Boom):
        engine_factory.run(flow)
    results = [e["result"] for e in tasks.entries("revert") if e["atom"] == "misshapen"]
    assert results == [[1], {"failure": "misshapen failed with 2"}]
