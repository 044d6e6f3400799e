"""Graph flow: children ordered by their data dependencies and explicit links."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import networkx as nx

from flowengine import deciders as de
from flowengine import exceptions as exc
from flowengine import flow
from flowengine.utils.cycle_free import UncachedDiGraph

if TYPE_CHECKING:
    from flowengine.retry import Retry


class Flow(flow.Flow):
    """Runs children in an order that satisfies their dependencies.

    A child that requires a name another child provides runs after it (inferred on ``add``);
    ``link`` adds explicit orderings, optionally guarded by a decider. Cycles are rejected.
    """

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        super().__init__(name, retry)
        # Its views are not kept in it: the flow and its atoms are freed as soon as the
        # program lets go of them (see flowengine.utils.cycle_free).
        self._graph: nx.DiGraph = UncachedDiGraph()
        # name -> children providing it, so inference is a dict lookup per requirement.
        self._providers: dict[str, list[flow.Item]] = {}
        self._requirers: dict[str, list[flow.Item]] = {}

    def _retry_provides(self) -> frozenset[str]:
        return self.retry.provides if self.retry is not None else frozenset()

    def add(
        self, *items: flow.Item, resolve_requires: bool = True, resolve_existing: bool = True
    ) -> Flow:
        """Add items, linking them to providers of what they require (and vice versa).

        Raises:
            AmbiguousDependency: a requirement is provided by more than one child.
            DependencyFailure: the inferred links would create a cycle (nothing is added).
        """
        new: list[flow.Item] = []
        new_set: set[int] = set()
        for item in items:
            self._check_child(item, deep=True)
            if item not in self._graph and id(item) not in new_set:
                new.append(item)
                new_set.add(id(item))
        if not new:
            return self
        # Mutate in place and roll back on error: copying the graph (or scanning every node) per
        # add() would make building an n-item flow one add() at a time quadratic.
        graph = self._graph
        providers = self._providers
        retry_provides = self._retry_provides()
        for item in new:
            graph.add_node(item)
            for name in item.provides:
                providers.setdefault(name, []).append(item)
        try:
            if resolve_requires:
                for item in new:
                    for name in sorted(item.requires - retry_provides):
                        self._link_to_provider(graph, providers, item, name)
            if resolve_existing:
                for item in new:
                    for name in sorted(item.provides):
                        for requirer in self._requirers.get(name, ()):
                            if name not in retry_provides:
                                self._link_to_provider(graph, providers, requirer, name)
            # Only a new item's edges are new, so any cycle now runs through a new item: one
            # search from the new items (not one per new edge) finds it, in linear time.
            cycle = _find_cycle(graph, new)
            if cycle is not None:
                self._refuse_cycle(cycle, lambda node: id(node) in new_set)
        except Exception:
            graph.remove_nodes_from(new)
            for item in new:
                for name in item.provides:
                    providers[name].remove(item)
            raise
        for item in new:
            for name in item.requires:
                self._requirers.setdefault(name, []).append(item)
        self._changed()
        return self

    def _link_to_provider(
        self,
        graph: nx.DiGraph,
        providers: dict[str, list[flow.Item]],
        item: flow.Item,
        name: str,
    ) -> None:
        candidates = [p for p in providers.get(name, ()) if p is not item]
        if not candidates:
            return
        if len(candidates) > 1:
            raise exc.AmbiguousDependency(
                f"Flow {self.name!r}: {item.name!r} requires {name!r}, which is provided by "
                f"more than one item: {sorted(c.name for c in candidates)}"
            )
        _add_link(graph, candidates[0], item, reason=name)

    def link(
        self,
        u: flow.Item,
        v: flow.Item,
        decider: Callable[..., bool] | None = None,
        decider_depth: de.Depth | str | None = None,
    ) -> Flow:
        """Make ``v`` run after ``u``; ``decider(history=...)`` may veto running ``v``.

        Raises:
            ValueError: a node is not in the flow, the decider is not callable, or a depth is
                given without a decider.
            DependencyFailure: the link would create a cycle.
        """
        for node, role in ((u, "from"), (v, "to")):
            if node not in self._graph:
                raise ValueError(f"Node {node!r} not found to link {role} (flow {self.name!r})")
        if decider is not None and not callable(decider):
            raise ValueError(f"Flow {self.name!r}: decider for link {u} -> {v} must be callable")
        if decider_depth is not None and decider is None:
            raise ValueError(f"Flow {self.name!r}: decider depth requires a decider")
        depth = (de.Depth.translate(de.Depth.ALL if decider_depth is None else decider_depth)
                 if decider else None)
        if not self._graph.has_edge(u, v):
            self._graph.add_edge(u, v)
            cycle = _find_cycle(self._graph, [u])
            if cycle is not None:
                self._graph.remove_edge(u, v)
                self._refuse_cycle(cycle, lambda node: node is u)
        attrs = _add_link(self._graph, u, v)
        attrs[flow.LINK_MANUAL] = True
        if decider is not None:
            attrs[flow.LINK_DECIDER] = decider
            attrs[flow.LINK_DECIDER_DEPTH] = depth
        self._changed()
        return self

    def _refuse_cycle(self, cycle: list[flow.Item], is_new: Callable[[Any], bool]) -> None:
        """Raise DependencyFailure naming the new link that closes ``cycle`` and the cycle."""
        u, v = next((u, v) for u, v in zip(cycle, cycle[1:]) if is_new(u) or is_new(v))
        names = [repr(node.name) for node in cycle]
        if len(names) > 8:
            names = names[:4] + [f"... {len(names) - 7} more ..."] + names[-3:]
        raise exc.DependencyFailure(
            f"No path through the node(s) in the graph produces an ordering that will allow "
            f"for logical edge traversal: in flow {self.name!r}, linking {u.name!r} -> "
            f"{v.name!r} creates a cycle ({' -> '.join(names)})"
        )

    def _changed(self) -> None:
        """Hook for subclasses that cache views of the graph."""

    def __len__(self) -> int:
        return self._graph.number_of_nodes()

    def __iter__(self) -> Iterator[flow.Item]:
        # In a dependency order, as TaskFlow's: programs see it (and it decides which of
        # several providers of a name is closest to a consumer).
        return iter(nx.topological_sort(self._graph))

    def iter_links(self) -> Iterator[tuple[flow.Item, flow.Item, dict[str, Any]]]:
        yield from self._graph.edges(data=True)

    def iter_nodes(self) -> Iterator[tuple[flow.Item, dict[str, Any]]]:
        graph = self._graph
        return ((node, graph.nodes[node]) for node in nx.topological_sort(graph))

    @property
    def requires(self) -> frozenset[str]:
        """Names needed from outside: requirements no predecessor or the retry satisfies."""
        retry_provides = self._retry_provides()
        needed: set[str] = set(self.retry.requires) if self.retry is not None else set()
        provided_here: set[str] = set().union(*(item.provides for item in self))
        graph = self._graph
        # Inference links a requirer to its provider directly, so a direct predecessor almost
        # always settles it; only the rest need the (one, linear) pass over ancestors.
        unsettled: dict[flow.Item, set[str]] = {}
        for item in self:
            missing = item.requires - retry_provides
            if not missing:
                continue
            needed.update(missing - provided_here)
            inside = set(missing & provided_here)
            for pred in graph.predecessors(item):
                if not inside:
                    break
                inside.difference_update(pred.provides)
            if inside:
                unsettled[item] = inside
        if unsettled:
            needed.update(_unprovided_by_ancestors(graph, unsettled))
        # Items' needs already exclude what the retry provides; the retry's own stay (TaskFlow).
        return frozenset(needed)


def _unprovided_by_ancestors(
    graph: nx.DiGraph, wanted: dict[flow.Item, set[str]]
) -> set[str]:
    """Names in ``wanted[item]`` that no ancestor of ``item`` provides, in one pass."""
    # Track only the names asked about, so each node carries a small set, not its ancestry.
    names = set().union(*wanted.values())
    above: dict[flow.Item, set[str]] = {}
    unprovided: set[str] = set()
    for node in nx.topological_sort(graph):
        seen: set[str] = set()
        for pred in graph.predecessors(node):
            seen |= above[pred]
            seen |= pred.provides & names
        above[node] = seen
        if node in wanted:
            unprovided |= wanted[node] - seen
    return unprovided


def _find_cycle(graph: nx.DiGraph, roots: Iterable[Any]) -> list[Any] | None:
    """A cycle reachable from ``roots`` as ``[n0, n1, ..., n0]``, or None; O(nodes reached)."""
    succ = graph.succ
    done: set[Any] = set()
    for root in roots:
        if root in done:
            continue
        path = [root]
        on_path = {root}
        pending = [iter(succ[root])]
        while pending:
            for node in pending[-1]:
                if node in on_path:
                    return path[path.index(node):] + [node]
                if node not in done:
                    path.append(node)
                    on_path.add(node)
                    pending.append(iter(succ[node]))
                    break
            else:
                pending.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
    return None


def _add_link(graph: nx.DiGraph, u: flow.Item, v: flow.Item, reason: str | None = None) -> dict:
    if not graph.has_edge(u, v):
        graph.add_edge(u, v)
    attrs: dict[str, Any] = graph.edges[u, v]
    if reason is not None:
        attrs.setdefault(flow.LINK_REASONS, set()).add(reason)
    return attrs


class TargetedFlow(Flow):
    """A graph flow that, once given a target, runs only the target and what it depends on."""

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        super().__init__(name, retry)
        self._target: flow.Item | None = None
        self._subgraph: nx.DiGraph | None = None

    def set_target(self, target_node: flow.Item) -> None:
        """Only ``target_node`` and its predecessors will run."""
        if target_node not in self._graph:
            raise ValueError(f"Node {target_node!r} not found (the target of flow "
                             f"{self.name!r} must be one of its nodes)")
        self._target = target_node
        self._subgraph = None

    def reset_target(self) -> None:
        """Run everything again."""
        self._target = None
        self._subgraph = None

    def _changed(self) -> None:
        self._subgraph = None

    def _active(self) -> nx.DiGraph:
        if self._target is None:
            return self._graph
        if self._subgraph is None:
            keep = nx.ancestors(self._graph, self._target) | {self._target}
            self._subgraph = self._graph.subgraph(keep)
        return self._subgraph

    def __len__(self) -> int:
        return self._active().number_of_nodes()

    def __iter__(self) -> Iterator[flow.Item]:
        return iter(nx.topological_sort(self._active()))

    def iter_links(self) -> Iterator[tuple[flow.Item, flow.Item, dict[str, Any]]]:
        yield from self._active().edges(data=True)

    def iter_nodes(self) -> Iterator[tuple[flow.Item, dict[str, Any]]]:
        graph = self._active()
        return ((node, graph.nodes[node]) for node in nx.topological_sort(graph))
