"""The compiler: graph shape, checks before running, and linear size."""

from __future__ import annotations

import pytest

from flowengine import exceptions as exc
from flowengine import retry, task
from flowengine.engines.compiler import FLOW, FLOW_END, RETRY, TASK, PatternCompiler
from flowengine.flows import graph_flow as gf
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf


class Noop(task.Task):
    def execute(self) -> None:
        return None


def test_atoms_are_listed_in_topological_order() -> None:
    flow = lf.Flow("f").add(Noop("a"), uf.Flow("u").add(Noop("b"), Noop("c")), Noop("d"))
    compilation = PatternCompiler(flow).compile()
    names = list(compilation.atoms)
    assert names[0] == "a" and names[-1] == "d"
    assert set(names[1:3]) == {"b", "c"}


def test_node_kinds_and_retry_scopes() -> None:
    controller = retry.Times(2, name="r")
    inner = lf.Flow("inner").add(Noop("b"))
    flow = lf.Flow("outer", retry=controller).add(Noop("a"), inner)
    compilation = PatternCompiler(flow).compile()
    kinds = {compilation.kind(n) for n in compilation.execution_graph.nodes}
    assert kinds == {TASK, RETRY, FLOW, FLOW_END}
    assert [a.name for a in compilation.retry_scopes["r"]] == ["a", "b"]
    assert compilation.retry_of(compilation.atoms["b"]) is controller
    assert compilation.retry_of(controller) is None
    assert [f.name for f in compilation.parents_of(compilation.atoms["b"])] == ["outer", "inner"]


def test_edges_grow_linearly_when_linking_wide_flows() -> None:
    # Linking whole flows goes through their end/start nodes, not atom-to-atom.
    width, depth = 50, 20
    flow = lf.Flow("f")
    for level in range(depth):
        flow.add(uf.Flow(f"u{level}").add(*[Noop(f"t{level}-{i}") for i in range(width)]))
    graph = PatternCompiler(flow).compile().execution_graph
    atoms = width * depth
    assert graph.number_of_edges() <= 3 * atoms
    assert graph.number_of_nodes() == atoms + 2 * depth + 2


def test_duplicate_names_are_rejected_with_the_name() -> None:
    flow = lf.Flow("f").add(Noop("same"), Noop("same"))
    with pytest.raises(exc.Duplicate, match="same"):
        PatternCompiler(flow).compile()


def test_same_atom_twice_in_nested_flows_is_rejected() -> None:
    shared = Noop("shared")
    flow = lf.Flow("f").add(lf.Flow("x").add(shared), lf.Flow("y").add(shared))
    with pytest.raises(ValueError, match="shared"):
        PatternCompiler(flow).compile()


def test_non_atoms_are_rejected_naming_the_flow() -> None:
    with pytest.raises(TypeError, match="'f'"):
        lf.Flow("f").add(object())


def test_graph_flow_cycle_is_rejected_and_discarded() -> None:
    a, b = Noop("a"), Noop("b")
    flow = gf.Flow("g").add(a, b)
    flow.link(a, b)
    with pytest.raises(exc.DependencyFailure, match="cycle"):
        flow.link(b, a)
    assert len(list(flow.iter_links())) == 1


def test_graph_flow_ambiguous_provider() -> None:
    class Needs(task.Task):
        def execute(self, x: int) -> int:
            return x

    flow = gf.Flow("g").add(Noop("p1", provides="x"), Noop("p2", provides="x"))
    with pytest.raises(exc.AmbiguousDependency, match="'x'"):
        flow.add(Needs("c"))
    assert len(flow) == 2


def test_graph_flow_infers_links_both_ways() -> None:
    class Needs(task.Task):
        def execute(self, x: int) -> int:
            return x

    consumer = Needs("c")
    producer = Noop("p", provides="x")
    flow = gf.Flow("g").add(consumer)
    flow.add(producer)
    assert [(u.name, v.name) for u, v, _ in flow.iter_links()] == [("p", "c")]


def test_one_at_a_time_graph_building_stays_cheap() -> None:
    class Chain(task.Task):
        def execute(self, prev: int) -> int:
            return prev

    flow = gf.Flow("g")
    count = 3000
    for i in range(count):
        flow.add(Chain(f"t{i}", provides=f"v{i}", rebind={"prev": f"v{i - 1}"}))
    assert len(list(flow.iter_links())) == count - 1
