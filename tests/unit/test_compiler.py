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


class Counted(task.Task):
    """A chain link that counts how often it is hashed: a measure of graph work done on it."""

    hashes = 0

    def __hash__(self) -> int:
        Counted.hashes += 1
        return id(self) >> 4

    def execute(self, prev: int) -> int:
        return prev


def _chain_work(count: int) -> tuple[int, int, int]:
    """Hashes spent by a bulk add, ``requires`` and compiling, for a chain of ``count``."""
    links = [Counted(f"t{i}", provides=f"v{i}", rebind={"prev": f"v{i - 1}"})
             for i in range(count)]
    spent = []
    Counted.hashes = 0
    flow = gf.Flow("g").add(*links)
    spent.append(Counted.hashes)
    Counted.hashes = 0
    assert flow.requires == {"v-1"}
    spent.append(Counted.hashes)
    Counted.hashes = 0
    PatternCompiler(flow).compile()
    spent.append(Counted.hashes)
    return spent[0], spent[1], spent[2]


def test_bulk_graph_add_requires_and_compile_do_linear_work() -> None:
    # Work, not time: four times the items must cost about four times the hashing (a
    # quadratic step, such as a search per new link or per item, costs sixteen times).
    small, large = _chain_work(250), _chain_work(1000)
    for step, few, many in zip(("add", "requires", "compile"), small, large):
        assert many <= 5 * few, f"{step}: {few} hashes for 250 items, {many} for 1000"


def test_graph_flow_cycle_in_one_bulk_add_names_a_new_link_and_the_cycle() -> None:
    class Needs(task.Task):
        def execute(self, **kwargs: int) -> None:
            return None

    ring = [Needs(f"n{i}", provides=f"v{i}", requires=[f"v{(i - 1) % 12}"]) for i in range(12)]
    flow = gf.Flow("ringed").add(Noop("before"))
    with pytest.raises(exc.DependencyFailure, match=r"'ringed'.*'n0' -> 'n1'.*more") as info:
        flow.add(*ring)
    assert "'n11' -> 'n0')" in str(info.value)
    assert [item.name for item in flow] == ["before"]
    assert list(flow.iter_links()) == []
    assert flow.add(*ring[1:]).requires == {"v0"}

