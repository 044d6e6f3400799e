"""How atoms get their arguments and how their results are stored, on every engine."""

from __future__ import annotations

import importlib

import pytest

from flowengine import exceptions as exc
from flowengine import task
from flowengine.flows import graph_flow as gf
from flowengine.flows import linear_flow as lf

from . import tasks


def executed_with(atom: str) -> dict:
    [entry] = [e for e in tasks.entries("execute") if e["atom"] == atom]
    return {k: v for k, v in entry.items() if k not in ("seq", "event", "atom")}


def test_arguments_come_from_the_store(engine_factory):
    engine = engine_factory.run(tasks.Add("sum", provides="total"), store={"x": 1, "y": 2})
    assert executed_with("sum") == {"x": 1, "y": 2}
    assert engine.storage.fetch("total") == 3


def test_storage_inject_after_load(engine_factory):
    engine = engine_factory(tasks.Add("sum", provides="total"))
    engine.storage.inject({"x": "a", "y": "b"})
    engine.run()
    assert engine.storage.fetch("total") == "ab"


def test_requires_adds_arguments_to_a_kwargs_task(engine_factory):
    flow = lf.Flow("f").add(tasks.Gather("g", requires=["a", "b"], provides="got"))
    engine = engine_factory.run(flow, store={"a": 1, "b": 2, "c": 3})
    assert engine.storage.fetch("got") == {"a": 1, "b": 2}


def test_requires_as_a_single_string(engine_factory):
    flow = lf.Flow("f").add(tasks.Gather("g", requires="a", provides="got"))
    engine = engine_factory.run(flow, store={"a": 1, "b": 2})
    assert engine.storage.fetch("got") == {"a": 1}


@pytest.mark.parametrize(
    ("provides", "value", "expected"),
    [
        ("whole", [1, 2], {"whole": [1, 2]}),
        (("first", "second"), [1, 2], {"first": 1, "second": 2}),
        (["first", "second"], [1, 2], {"first": 1, "second": 2}),
        (("only_first",), [7, 8, 9], {"only_first": 7}),
        ({"a", "b"}, {"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2}),
        ("whole", {"a": 1}, {"whole": {"a": 1}}),
    ],
    ids=["str", "tuple", "list", "tuple-prefix", "set-of-dict-keys", "str-of-dict"],
)
def test_provides_shapes(engine_factory, provides, value, expected):
    flow = lf.Flow("f").add(tasks.Constant("c", provides=provides, inject={"value": value}))
    engine = engine_factory.run(flow)
    for name, item in expected.items():
        assert engine.storage.fetch(name) == item
    assert engine.storage.get("c") == value


def test_tuple_provides_feed_separate_consumers(engine_factory):
    flow = lf.Flow("f").add(
        tasks.Constant("pair", provides=("x", "y"), inject={"value": [3, 4]}),
        tasks.Add("sum", provides="total"),
    )
    engine = engine_factory.run(flow)
    assert engine.storage.fetch("total") == 7


def test_rebind_dict_maps_arguments_to_other_names(engine_factory):
    flow = tasks.Add("sum", rebind={"x": "left", "y": "right"}, provides="total")
    engine = engine_factory.run(flow, store={"left": 10, "right": 5, "x": 0, "y": 0})
    assert executed_with("sum") == {"x": 10, "y": 5}
    assert engine.storage.fetch("total") == 15


def test_rebind_list_maps_arguments_by_position(engine_factory):
    flow = tasks.Add("sum", rebind=["right", "left"], provides="total")
    engine_factory.run(flow, store={"left": "L", "right": "R"})
    assert executed_with("sum") == {"x": "R", "y": "L"}


def test_rebind_list_on_a_kwargs_task_names_extra_arguments(engine_factory):
    flow = tasks.Gather("g", rebind=["a", "b"], provides="got")
    engine = engine_factory.run(flow, store={"a": 1, "b": 2, "c": 3})
    assert engine.storage.fetch("got") == {"a": 1, "b": 2}


def test_rebind_partial_dict_keeps_other_arguments(engine_factory):
    flow = tasks.Add("sum", rebind={"y": "other"}, provides="total")
    engine_factory.run(flow, store={"x": 1, "y": 100, "other": 2})
    assert executed_with("sum") == {"x": 1, "y": 2}


def test_inject_gives_one_atom_its_own_values(engine_factory):
    flow = lf.Flow("f").add(
        tasks.Add("injected", inject={"x": 100}, provides="a"),
        tasks.Add("plain", provides="b"),
    )
    engine = engine_factory.run(flow, store={"x": 1, "y": 2})
    assert engine.storage.fetch("a") == 102
    assert engine.storage.fetch("b") == 3


def test_inject_wins_over_results_of_other_atoms(engine_factory):
    flow = lf.Flow("f").add(
        tasks.Constant("producer", provides="x", inject={"value": 1}),
        tasks.Scale("consumer", inject={"x": 5}, provides="out"),
    )
    engine = engine_factory.run(flow)
    assert engine.storage.fetch("out") == 50


@pytest.mark.parametrize("transient", [True, False])
def test_inject_works_whether_transient_or_stored(engine_factory, transient):
    flow = tasks.Scale("s", inject={"x": 3, "factor": 3}, provides="out")
    engine = engine_factory.run(flow, inject_transient=transient)
    assert engine.storage.fetch("out") == 9


def test_optional_argument_uses_its_default_when_nothing_provides_it(engine_factory):
    engine = engine_factory.run(tasks.Scale("s", provides="out"), store={"x": 2})
    assert executed_with("s") == {"x": 2, "factor": 10}
    assert engine.storage.fetch("out") == 20


def test_optional_argument_taken_from_store_when_present(engine_factory):
    engine = engine_factory.run(tasks.Scale("s", provides="out"), store={"x": 2, "factor": 3})
    assert engine.storage.fetch("out") == 6


def test_optional_argument_taken_from_an_earlier_atom(engine_factory):
    flow = lf.Flow("f").add(
        tasks.Constant("factor-maker", provides="factor", inject={"value": 4}),
        tasks.Scale("s", provides="out"),
    )
    engine = engine_factory.run(flow, store={"x": 2})
    assert engine.storage.fetch("out") == 8


def test_optional_argument_rebound_to_another_name(engine_factory):
    flow = tasks.Scale("s", rebind={"factor": "multiplier"}, provides="out")
    engine = engine_factory.run(flow, store={"x": 2, "multiplier": 7})
    assert engine.storage.fetch("out") == 14


def test_default_provides_is_used_without_provides(engine_factory):
    engine = engine_factory.run(tasks.Greeting("hi"), store={"who": "ann"})
    assert engine.storage.fetch("greeting") == "hello ann"


def test_explicit_provides_replaces_default_provides(engine_factory):
    engine = engine_factory.run(tasks.Greeting("hi", provides="salute"), store={"who": "bo"})
    assert engine.storage.fetch("salute") == "hello bo"
    with pytest.raises(exc.NotFound):
        engine.storage.fetch("greeting")


def test_graph_flow_infers_order_from_default_provides(engine_factory):
    flow = gf.Flow("g").add(
        tasks.Gather("reader", requires=["greeting"], provides="got"),
        tasks.Greeting("writer"),
    )
    engine = engine_factory.run(flow, store={"who": "cy"})
    assert tasks.names("execute") == ["writer", "reader"]
    assert engine.storage.fetch("got") == {"greeting": "hello cy"}


def test_later_provider_shadows_earlier_one_for_later_consumers(engine_factory):
    flow = lf.Flow("f").add(
        tasks.Constant("first", provides="x", inject={"value": 1}),
        tasks.Scale("uses-first", provides="a"),
        tasks.Constant("second", provides="x", inject={"value": 2}),
        tasks.Scale("uses-second", provides="b"),
    )
    engine = engine_factory.run(flow)
    assert engine.storage.fetch("a") == 10
    assert engine.storage.fetch("b") == 20
    assert sorted(engine.storage.fetch_all()["x"]) == [1, 2]


def test_nested_flow_results_reach_consumers_after_the_flow(engine_factory):
    inner = lf.Flow("inner").add(
        tasks.Constant("deep", provides=("p", "q"), inject={"value": ["P", "Q"]}))
    flow = lf.Flow("outer").add(inner, tasks.Gather("g", requires=("p", "q"), provides="got"))
    engine = engine_factory.run(flow)
    assert engine.storage.fetch("got") == {"p": "P", "q": "Q"}


# Functor tasks run on local engines only: their behaviour is the function given to the
# constructor, and a worker builds a task from its class and name alone (as TaskFlow's does).


def test_functor_task_requirements_come_from_the_function(local_engine_factory):
    flow = lf.Flow("f").add(
        task.FunctorTask(tasks.double, name="double", provides="d"),
        task.FunctorTask(tasks.plus, name="plus", rebind={"a": "x", "b": "d"}, provides="sum"))
    engine = local_engine_factory.run(flow, store={"x": 4})
    assert engine.storage.fetch("sum") == 12


def test_functor_task_revert_function_gets_arguments_and_result(local_engine_factory):
    flow = lf.Flow("f").add(
        task.FunctorTask(tasks.double, name="double", provides="d", revert=tasks.undo_double),
        tasks.Fail("boom"))
    with local_engine_factory.raises(tasks.Boom):
        local_engine_factory.run(flow, store={"x": 4})
    [undone] = tasks.entries("revert")[1:]
    assert (undone["x"], undone["result"], undone["flow_failures"]) == (4, 8, ["boom"])


def test_map_and_reduce_functor_tasks(local_engine_factory):
    flow = lf.Flow("f").add(
        task.MapFunctorTask(tasks.double, requires=["p", "q"], name="map", provides="mapped"),
        task.ReduceFunctorTask(tasks.plus, requires=["p", "q", "r"], name="reduce",
                               provides="total"))
    engine = local_engine_factory.run(flow, store={"p": 1, "q": 2, "r": 3})
    assert engine.storage.fetch("mapped") == [2, 4]
    assert engine.storage.fetch("total") == 6


def _positional_only(a, /):
    return a


FUNCTOR_SHAPES = {
    "none": lambda: 0,
    "one": lambda a: a,
    "one-positional-only": _positional_only,
    "two": lambda a, b: a,
    "one-and-a-default": lambda a, b=1: a,
    "one-and-keyword-only": lambda a, *, b: a,
    "star-args": lambda *args: 0,
    "one-and-star-kwargs": lambda a, **kwargs: a,
}


@pytest.mark.parametrize("shape", sorted(FUNCTOR_SHAPES))
@pytest.mark.parametrize("kind", ["MapFunctorTask", "ReduceFunctorTask"])
def test_map_and_reduce_refuse_the_functors_taskflow_refuses(kind, shape):
    functor = FUNCTOR_SHAPES[shape]
    tf_task = importlib.import_module("taskflow.task")  # a test dependency: the reference
    try:
        getattr(tf_task, kind)(functor, requires=["p", "q"], name="t")
    except ValueError as refused:
        expected: str | None = str(refused)
    else:
        expected = None
    if expected is None:
        assert getattr(task, kind)(functor, requires=["p", "q"], name="t").name == "t"
    else:
        with pytest.raises(ValueError, match="'t'") as caught:
            getattr(task, kind)(functor, requires=["p", "q"], name="t")
        assert expected in str(caught.value)


@pytest.mark.parametrize("kind", ["MapFunctorTask", "ReduceFunctorTask"])
def test_map_and_reduce_refuse_a_string_for_requires(kind):
    functor = FUNCTOR_SHAPES["one" if kind == "MapFunctorTask" else "two"]
    with pytest.raises(TypeError, match="'t'.*Requires must be an iterable"):
        getattr(task, kind)(functor, requires="pq", name="t")
