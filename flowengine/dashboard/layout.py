"""A layered drawing of a flow's graph, computed on the server and drawn as SVG.

Atoms are placed in columns by their longest path from a start (an atom is right of every
atom it waits for), and ordered inside a column by the mean row of their predecessors, which
keeps most edges short and uncrossed without a layout engine in the browser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

#: Size of an atom's box and the gaps between boxes, in SVG units.
NODE_WIDTH, NODE_HEIGHT = 150, 34
COLUMN_GAP, ROW_GAP = 50, 14
MARGIN = 10


@dataclasses.dataclass(frozen=True)
class Node:
    """One atom's box."""

    name: str
    kind: str
    x: int
    y: int


@dataclasses.dataclass(frozen=True)
class Link:
    """An edge as an SVG path from ``source``'s right side to ``target``'s left side."""

    source: str
    target: str
    path: str


@dataclasses.dataclass(frozen=True)
class Layout:
    """A whole drawing."""

    nodes: list[Node]
    links: list[Link]
    width: int
    height: int
    node_width: int = NODE_WIDTH
    node_height: int = NODE_HEIGHT


def layers(names: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Columns of ``names``: each name one column right of its furthest predecessor.

    Edges naming unknown nodes are ignored; a cycle (none in a compiled flow) is broken by
    leaving the rest in the last column.
    """
    preds: dict[str, list[str]] = {n: [] for n in names}
    succs: dict[str, list[str]] = {n: [] for n in names}
    for source, target in edges:
        if source in preds and target in preds and source != target:
            preds[target].append(source)
            succs[source].append(target)
    waiting = {n: len(preds[n]) for n in names}
    column = {n: 0 for n in names}
    ready = [n for n in names if not waiting[n]]
    placed: list[str] = []
    while ready:
        name = ready.pop()
        placed.append(name)
        for nxt in succs[name]:
            column[nxt] = max(column[nxt], column[name] + 1)
            waiting[nxt] -= 1
            if not waiting[nxt]:
                ready.append(nxt)
    last = max(column.values(), default=0)
    for name in names:
        if name not in placed:
            column[name] = last + 1
    columns: list[list[str]] = [[] for _ in range(max(column.values(), default=-1) + 1)]
    for name in names:
        columns[column[name]].append(name)
    _order(columns, preds)
    return columns


def _order(columns: list[list[str]], preds: dict[str, list[str]]) -> None:
    """Sort each column by the mean row of each node's predecessors (barycentre)."""
    row: dict[str, float] = {}
    for column in columns:
        def centre(name: str) -> float:
            rows = [row[p] for p in preds[name] if p in row]
            return sum(rows) / len(rows) if rows else float(len(row))
        column.sort(key=centre)
        for index, name in enumerate(column):
            row[name] = index


def layout(kinds: dict[str, str], edges: Sequence[tuple[str, str]]) -> Layout:
    """Position every atom of ``kinds`` (name -> ``task``/``retry``) and route ``edges``."""
    columns = layers(list(kinds), edges)
    tallest = max((len(c) for c in columns), default=0)
    height = 2 * MARGIN + tallest * (NODE_HEIGHT + ROW_GAP) - (ROW_GAP if tallest else 0)
    where: dict[str, tuple[int, int]] = {}
    nodes = []
    for index, column in enumerate(columns):
        x = MARGIN + index * (NODE_WIDTH + COLUMN_GAP)
        top = MARGIN + (tallest - len(column)) * (NODE_HEIGHT + ROW_GAP) // 2
        for row, name in enumerate(column):
            y = top + row * (NODE_HEIGHT + ROW_GAP)
            where[name] = (x, y)
            nodes.append(Node(name, kinds[name], x, y))
    links = []
    for source, target in edges:
        if source in where and target in where:
            (x1, y1), (x2, y2) = where[source], where[target]
            x1, y1, y2 = x1 + NODE_WIDTH, y1 + NODE_HEIGHT // 2, y2 + NODE_HEIGHT // 2
            bend = (x2 - x1) // 2
            links.append(Link(source, target,
                              f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"))
    width = 2 * MARGIN + len(columns) * (NODE_WIDTH + COLUMN_GAP) - (COLUMN_GAP if columns else 0)
    return Layout(nodes, links, max(width, 0), max(height, 0))
