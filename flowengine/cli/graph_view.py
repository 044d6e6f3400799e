"""A compiled flow as a picture: atoms and the links between them, nested flows as clusters.

The compiler joins flows through structural start/end nodes; here those are collapsed, so every
edge goes from an atom to an atom that waits for it, and each nested flow becomes a cluster
(DOT) or subgraph (Mermaid) around its atoms. An edge that passes a link decider keeps it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from flowengine import flow as flow_mod
from flowengine.atom import Atom
from flowengine.engines.compiler import RETRY, Compilation


@dataclasses.dataclass(frozen=True)
class Edge:
    """``target`` waits for ``source``; ``deciders`` may skip it (``name`` or ``name@DEPTH``)."""

    source: str
    target: str
    deciders: tuple[str, ...] = ()


@dataclasses.dataclass
class Cluster:
    """A flow and what it directly holds: its atoms' names and its nested flows."""

    name: str
    pattern: str
    atoms: list[str] = dataclasses.field(default_factory=list)
    children: list[Cluster] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class FlowGraph:
    """The collapsed graph of one flow."""

    root: Cluster | None
    kinds: dict[str, str]
    edges: list[Edge]


def _decider_name(data: dict[str, Any]) -> str | None:
    decider = data.get(flow_mod.LINK_DECIDER)
    if decider is None:
        return None
    name = getattr(decider, "__name__", None) or type(decider).__name__
    depth = data.get(flow_mod.LINK_DECIDER_DEPTH)
    depth_name = getattr(depth, "name", depth)
    return name if depth_name in (None, "ALL") else f"{name}@{depth_name}"


def _atom_edges(compilation: Compilation, atom: Atom) -> Iterator[Edge]:
    """Edges from ``atom`` to the atoms reached through structural nodes only."""
    graph = compilation.execution_graph
    found: dict[str, set[str]] = {}
    pending: list[tuple[Any, tuple[str, ...]]] = [(atom, ())]
    seen: set[tuple[int, tuple[str, ...]]] = set()
    while pending:
        node, deciders = pending.pop()
        for succ, data in graph.adj[node].items():
            marks = deciders
            name = _decider_name(data)
            if name is not None:
                marks = tuple(sorted({*deciders, name}))
            if isinstance(succ, Atom):
                found.setdefault(succ.name, set()).update(marks)
            elif (id(succ), marks) not in seen:
                seen.add((id(succ), marks))
                pending.append((succ, marks))
    for target in sorted(found):
        yield Edge(atom.name, target, tuple(sorted(found[target])))


def _pattern(flow: Any) -> str:
    return type(flow).__module__.rsplit(".", 1)[-1]


def build(compilation: Compilation) -> FlowGraph:
    """Collapse ``compilation``'s execution graph to atoms, edges and flow clusters."""
    kinds: dict[str, str] = {}
    edges: list[Edge] = []
    clusters: dict[int, Cluster] = {}
    root: Cluster | None = None
    for atom in compilation.iter_atoms():
        kinds[atom.name] = compilation.kind(atom)
        edges.extend(_atom_edges(compilation, atom))
        parent: Cluster | None = None
        for flow in compilation.parents_of(atom):
            cluster = clusters.get(id(flow))
            if cluster is None:
                cluster = clusters[id(flow)] = Cluster(flow.name, _pattern(flow))
                if parent is None:
                    root = cluster
                else:
                    parent.children.append(cluster)
            parent = cluster
        if parent is not None:
            parent.atoms.append(atom.name)
    return FlowGraph(root, kinds, edges)


def to_json(graph: FlowGraph) -> str:
    """Nodes (name, kind, flows enclosing it), edges (source, target, deciders), flow tree."""
    where: dict[str, list[str]] = {}

    def walk(cluster: Cluster, path: list[str]) -> dict[str, Any]:
        path = [*path, cluster.name]
        for name in cluster.atoms:
            where[name] = path
        return {"name": cluster.name, "pattern": cluster.pattern, "atoms": cluster.atoms,
                "flows": [walk(child, path) for child in cluster.children]}

    tree = None if graph.root is None else walk(graph.root, [])
    nodes = [{"name": name, "kind": kind, "flows": where.get(name, [])}
             for name, kind in graph.kinds.items()]
    edges = [{"source": e.source, "target": e.target, "deciders": list(e.deciders)}
             for e in graph.edges]
    return json.dumps({"flow": tree, "nodes": nodes, "edges": edges}, indent=2)


def _dot_id(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: FlowGraph) -> str:
    """Graphviz DOT: boxes for tasks, hexagons for retries, dashed edges for deciders."""
    title = graph.root.name if graph.root else "flow"
    lines = [f"digraph {_dot_id(title)} {{", "  rankdir=LR;", "  node [shape=box];"]
    counter = iter(range(1_000_000))

    def cluster_lines(cluster: Cluster, indent: str) -> None:
        for name in cluster.atoms:
            shape = ", shape=hexagon" if graph.kinds[name] == RETRY else ""
            lines.append(f"{indent}{_dot_id(name)} [label={_dot_id(name)}{shape}];")
        for child in cluster.children:
            lines.append(f"{indent}subgraph cluster_{next(counter)} {{")
            lines.append(f"{indent}  label={_dot_id(f'{child.name} ({child.pattern})')};")
            cluster_lines(child, indent + "  ")
            lines.append(f"{indent}}}")

    if graph.root is not None:
        lines.append(f"  label={_dot_id(f'{graph.root.name} ({graph.root.pattern})')};")
        cluster_lines(graph.root, "  ")
    else:
        for name, kind in graph.kinds.items():
            lines.append(f"  {_dot_id(name)}{' [shape=hexagon]' if kind == RETRY else ''};")
    for edge in graph.edges:
        attrs = ""
        if edge.deciders:
            attrs = f" [style=dashed, label={_dot_id('decider: ' + ', '.join(edge.deciders))}]"
        lines.append(f"  {_dot_id(edge.source)} -> {_dot_id(edge.target)}{attrs};")
    lines.append("}")
    return "\n".join(lines)


def _mermaid_text(text: str) -> str:
    return '"' + text.replace('"', "#quot;") + '"'


def to_mermaid(graph: FlowGraph) -> str:
    """Mermaid flowchart: subgraphs for nested flows, dotted labelled edges for deciders."""
    ids = {name: f"a{i}" for i, name in enumerate(graph.kinds)}
    lines = ["flowchart LR"]
    counter = iter(range(1_000_000))

    def node(name: str) -> str:
        text = _mermaid_text(name)
        if graph.kinds[name] == RETRY:
            return f"{ids[name]}{{{{{text}}}}}"
        return f"{ids[name]}[{text}]"

    def cluster_lines(cluster: Cluster, indent: str) -> None:
        lines.extend(f"{indent}{node(name)}" for name in cluster.atoms)
        for child in cluster.children:
            label = _mermaid_text(f"{child.name} ({child.pattern})")
            lines.append(f"{indent}subgraph f{next(counter)}[{label}]")
            cluster_lines(child, indent + "  ")
            lines.append(f"{indent}end")

    if graph.root is not None:
        cluster_lines(graph.root, "  ")
    else:
        lines.extend(f"  {node(name)}" for name in graph.kinds)
    for edge in graph.edges:
        if edge.deciders:
            label = _mermaid_text("decider: " + ", ".join(edge.deciders))
            lines.append(f"  {ids[edge.source]} -.->|{label}| {ids[edge.target]}")
        else:
            lines.append(f"  {ids[edge.source]} --> {ids[edge.target]}")
    return "\n".join(lines)


RENDERERS = {"dot": to_dot, "mermaid": to_mermaid, "json": to_json}
