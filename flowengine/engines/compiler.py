"""Compile a flow into an execution graph (networkx) and check it before anything runs.

Every flow becomes two structural nodes, its start and its end, with its retry controller (if
any) right after the start; each child hangs between them and links join a child's exit to the
next child's entry. Atoms are graph nodes themselves. Linking whole flows through their end and
start nodes keeps the edge count linear in the number of atoms.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import networkx as nx

from flowengine import deciders as de
from flowengine import exceptions as exc
from flowengine import flow as flow_mod
from flowengine.atom import Atom
from flowengine.retry import Retry
from flowengine.utils.cycle_free import forget_views

TASK = "task"
RETRY = "retry"
FLOW = "flow"
FLOW_END = "flow_end"
ATOMS = (TASK, RETRY)
FLOWS = (FLOW, FLOW_END)


class FlowStart:
    """The structural node every item of ``flow`` starts after."""

    __slots__ = ("flow",)

    def __init__(self, flow: flow_mod.Flow) -> None:
        self.flow = flow

    @property
    def name(self) -> str:
        return self.flow.name

    def __repr__(self) -> str:
        return f"<start of {self.flow.name!r}>"


class FlowEnd(FlowStart):
    """The structural node that finishes after every item of ``flow``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<end of {self.flow.name!r}>"


@dataclasses.dataclass(frozen=True)
class EdgeDecider:
    """A decider guarding an atom: ``decider(history=...)`` may veto running it."""

    from_node: Any
    kind: str
    decider: Any
    depth: de.Depth


@dataclasses.dataclass
class Compilation:
    """The compiled form of a flow.

    Attributes:
        execution_graph: DiGraph of atoms and structural nodes; node attribute ``kind`` is one
            of TASK, RETRY, FLOW, FLOW_END; atoms carry ``retry`` (the controller handling
            their failures, or None) and ``parents`` (enclosing flows, outermost first).
        atoms: every atom by name, in a topological order.
        retry_scopes: for each retry controller's name, the atoms of the flow it controls.
        flow: the compiled root.
        preorder: each atom's position when the flows are walked depth first, each flow's retry
            before its items; of two providers a consumer sees in the same flow, the later is
            the closer (TaskFlow's scope order).
        declared: every atom in TaskFlow's storage order: the flows' items depth first, each
            flow's retry after its items (the order of the flow detail's atom records and of
            a name's providers in ``fetch_all``).
    """

    execution_graph: nx.DiGraph
    atoms: dict[str, Atom]
    retry_scopes: dict[str, list[Atom]]
    flow: Any
    declared: list[Atom] = dataclasses.field(default_factory=list)
    preorder: dict[str, int] = dataclasses.field(default_factory=dict)
    _deciders: dict[str, tuple[EdgeDecider, ...]] = dataclasses.field(default_factory=dict)
    _successors: dict[str, list[Atom]] = dataclasses.field(default_factory=dict)
    #: Whether any link carries a decider (most flows have none: nothing to walk then).
    has_deciders: bool = True
    _scopes: dict[tuple[str, tuple[str, ...]], list[str]] = dataclasses.field(
        default_factory=dict)

    def kind(self, node: Any) -> str:
        """The kind of a graph node."""
        return self.execution_graph.nodes[node]["kind"]

    def retry_of(self, atom: Atom) -> Retry | None:
        """The retry controller that handles ``atom``'s failures."""
        return self.execution_graph.nodes[atom].get(RETRY)

    def parents_of(self, atom: Atom) -> tuple[flow_mod.Flow, ...]:
        """The flows enclosing ``atom``, outermost first."""
        return self.execution_graph.nodes[atom]["parents"]

    def retries_around(self, atom: Atom) -> list[Retry]:
        """The retry controllers of the flows enclosing ``atom`` (not ``atom`` itself)."""
        return [f.retry for f in self.parents_of(atom)
                if f.retry is not None and f.retry is not atom]

    def edge_deciders(self, atom: Atom) -> tuple[EdgeDecider, ...]:
        """Deciders on links into ``atom``, or into flows that ``atom`` starts."""
        if not self.has_deciders:
            return ()
        found = self._deciders.get(atom.name)
        if found is None:
            found = self._deciders[atom.name] = tuple(self._walk_deciders(atom))
        return found

    def _walk_deciders(self, atom: Atom) -> Iterator[EdgeDecider]:
        graph = self.execution_graph
        pending = [(u, atom) for u in graph.predecessors(atom)]
        seen: set[int] = set()
        while pending:
            u, v = pending.pop()
            data = graph.adj[u][v]
            decider = data.get(flow_mod.LINK_DECIDER)
            kind = graph.nodes[u]["kind"]
            if decider is not None:
                depth = data.get(flow_mod.LINK_DECIDER_DEPTH) or de.Depth.ALL
                yield EdgeDecider(u, kind, decider, depth)
            # A decider on a link into a flow guards the atoms that start that flow.
            if kind == FLOW and id(u) not in seen:
                seen.add(id(u))
                pending.extend((uu, u) for uu in graph.predecessors(u))

    def successors_of(self, atom: Atom) -> list[Atom]:
        """Every atom after ``atom`` in the graph, in a topological order.

        A retry's resolution sets their intentions, as TaskFlow's does: its subflow and
        whatever comes after the subflow.
        """
        found = self._successors.get(atom.name)
        if found is None:
            after = nx.descendants(self.execution_graph, atom)
            found = self._successors[atom.name] = [a for a in self.atoms.values() if a in after]
        return found

    def iter_atoms(self) -> Iterator[Atom]:
        """Every atom, in a topological order."""
        return iter(self.atoms.values())

    def visible_providers(self, consumer_name: str, candidates: list[str]) -> list[str]:
        """Those of ``candidates`` (atom names) that ``consumer_name`` can read from (the
        atoms before it), closest first: the storage's scope fetcher."""
        key = (consumer_name, tuple(candidates))
        cached = self._scopes.get(key)
        if cached is not None:
            return cached
        consumer = self.atoms.get(consumer_name)
        found: list[str] = []
        if consumer is not None:
            wanted = set(candidates)
            wanted.discard(consumer_name)
            graph = self.execution_graph
            seen = {id(consumer)}
            queue = collections.deque([consumer])
            while queue and wanted:
                for pred in graph.predecessors(queue.popleft()):
                    if id(pred) in seen:
                        continue
                    seen.add(id(pred))
                    if isinstance(pred, Atom) and pred.name in wanted:
                        found.append(pred.name)
                        wanted.discard(pred.name)
                    queue.append(pred)
        if len(found) > 1 and consumer is not None:
            found.sort(key=self._scope_order(consumer))
        self._scopes[key] = found
        return found

    def _scope_order(self, consumer: Atom) -> Callable[[str], tuple[int, int]]:
        """Sort key of the providers ``consumer`` sees, closest first, as TaskFlow's scopes:
        those in its innermost enclosing flow first, and in one flow the later ones first."""
        mine = self.parents_of(consumer)

        def key(name: str) -> tuple[int, int]:
            theirs = self.parents_of(self.atoms[name])
            shared = 0
            while shared < min(len(mine), len(theirs)) and mine[shared] is theirs[shared]:
                shared += 1
            return -shared, -self.preorder[name]

        return key


class PatternCompiler:
    """Turns a flow (or a single atom) into a :class:`Compilation`."""

    def __init__(self, root: Any) -> None:
        self._root = root

    def compile(self) -> Compilation:
        """Compile and check the root.

        Raises:
            TypeError: something in the flow is neither an atom nor a flow.
            Duplicate: two atoms share a name, or one atom object appears twice.
            ValueError: a flow contains itself (directly or through flows nested in it).
            CompilationFailure: the graph has a cycle.
        """
        graph = nx.DiGraph()
        scopes: dict[str, list[Atom]] = {}
        self._graph = graph
        self._scopes = scopes
        self._seen_objects: set[int] = set()
        self._names: dict[str, Any] = {}
        self._open_flows: set[int] = set()
        self._declared: list[Atom] = []
        self._compile(self._root, parents=(), retry=None)
        try:
            order = list(nx.topological_sort(graph))
        except nx.NetworkXUnfeasible as err:
            raise exc.CompilationFailure(
                f"Flow {getattr(self._root, 'name', self._root)!r} does not compile: its graph "
                f"has a cycle"
            ) from err
        atoms = {node.name: node for node in order if isinstance(node, Atom)}
        deciders = any(flow_mod.LINK_DECIDER in data for _u, _v, data in graph.edges(data=True))
        forget_views(graph)
        return Compilation(graph, atoms, scopes, self._root, declared=self._declared,
                           preorder={name: i for i, name in enumerate(self._names)},
                           has_deciders=deciders)

    def _add_atom(self, atom: Atom, parents: tuple[Any, ...], retry: Retry | None) -> None:
        if not isinstance(atom.name, str) or not atom.name:
            raise exc.CompilationFailure(f"Atom {atom!r} has no name")
        if id(atom) in self._seen_objects:
            # TaskFlow raises ValueError here; DuplicateAtom is both that and a Duplicate.
            raise exc.DuplicateAtom(f"Atom {atom.name!r} is added to the flow more than once")
        if atom.name in self._names:
            raise exc.Duplicate(f"Atoms with duplicate names found: [{atom.name!r}]")
        self._seen_objects.add(id(atom))
        self._names[atom.name] = atom
        kind = RETRY if isinstance(atom, Retry) else TASK
        self._graph.add_node(atom, kind=kind, retry=retry, parents=parents)
        for flow in parents:
            if flow.retry is not None and flow.retry is not atom:
                self._scopes[flow.retry.name].append(atom)

    def _compile(self, item: Any, parents: tuple[Any, ...], retry: Retry | None) -> tuple[Any, Any]:
        """Add ``item`` to the graph; return its (entry node, exit node)."""
        if isinstance(item, Atom) and not isinstance(item, Retry):
            self._add_atom(item, parents, retry)
            self._declared.append(item)
            return item, item
        if not isinstance(item, flow_mod.Flow):
            # TaskFlow's wording first; a retry controller is only ever a flow's ``retry``.
            where = f" in flow {parents[-1].name!r}" if parents else ""
            raise TypeError(
                f"Unknown object '{item}' ({type(item)}) requested to compile{where}: only tasks "
                f"and flows can be compiled (a retry controller must be a flow's retry)"
            )
        if id(item) in self._open_flows:
            # Flows nested in each other would otherwise recurse until Python gives up.
            chain = " -> ".join(repr(f.name) for f in parents[parents.index(item):] + (item,))
            raise ValueError(f"Flow {item.name!r} contains itself ({chain}): flows cannot be "
                             f"nested in each other")
        self._open_flows.add(id(item))
        bounds = self._compile_flow(item, parents, retry)
        self._open_flows.discard(id(item))
        return bounds

    def _compile_flow(
        self, item: flow_mod.Flow, parents: tuple[Any, ...], retry: Retry | None
    ) -> tuple[Any, Any]:
        graph = self._graph
        start, end = FlowStart(item), FlowEnd(item)
        graph.add_node(start, kind=FLOW, parents=parents)
        graph.add_node(end, kind=FLOW_END, parents=parents)
        head: Any = start
        inner_retry = retry
        inner_parents = parents + (item,)
        if item.retry is not None:
            if not isinstance(item.retry, Retry):
                raise TypeError(f"Flow {item.name!r} retry must be a Retry, not {item.retry!r}")
            self._scopes[item.retry.name] = []
            self._add_atom(item.retry, inner_parents, retry)
            graph.add_edge(start, item.retry, **{flow_mod.LINK_INVARIANT: True})
            head = item.retry
            inner_retry = item.retry
        bounds: dict[int, tuple[Any, Any]] = {}
        for child in item:
            bounds[id(child)] = self._compile(child, inner_parents, inner_retry)
        if item.retry is not None:
            self._declared.append(item.retry)
        has_in: set[int] = set()
        has_out: set[int] = set()
        for u, v, meta in item.iter_links():
            graph.add_edge(bounds[id(u)][1], bounds[id(v)][0], **dict(meta))
            has_out.add(id(u))
            has_in.add(id(v))
        for key, (entry, exit_) in bounds.items():
            if key not in has_in:
                graph.add_edge(head, entry, **{flow_mod.LINK_INVARIANT: True})
            if key not in has_out:
                graph.add_edge(exit_, end, **{flow_mod.LINK_INVARIANT: True})
        if not bounds:
            graph.add_edge(head, end, **{flow_mod.LINK_INVARIANT: True})
        return start, end
