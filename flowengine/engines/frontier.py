"""Which atoms can run or revert next, tracked with dependency counters.

Re-checking every predecessor of an atom whenever something finishes is quadratic for wide flows
(the end of a 10,000-atom unordered flow has 10,000 predecessors). Instead each node keeps two
counters, updated only when a neighbour's status flips:

- ``blocked_by_preds``: predecessors that have not finished executing (execute direction);
- ``blocked_by_succs``: successors that have not finished reverting (revert direction).

An atom counts as reverted for its predecessors only once its own successors have too, as in
TaskFlow (which checks every descendant): an ignored atom's successors may have run, and its
predecessors must not revert before them.

Structural nodes (flow starts and ends) finish the moment their own counter reaches zero, and the
flip propagates through them. An atom whose counter reaches zero becomes a *candidate*; the
runtime decides what (if anything) to do with it.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from flowengine import states
from flowengine.atom import Atom
from flowengine.engines.compiler import Compilation
from flowengine.utils.cycle_free import forget_views

# An atom counts as finished executing in these states (ignored atoms never block successors).
EXECUTED_STATES = frozenset((states.SUCCESS, states.IGNORE))
# ...and as finished reverting (or never needing it) in these.
UNDONE_STATES = frozenset((states.PENDING, states.REVERTED, states.IGNORE))


class Frontier:
    """Dependency counters over a compilation's execution graph."""

    def __init__(self, compilation: Compilation, atom_state: dict[str, str]) -> None:
        self._graph: nx.DiGraph = compilation.execution_graph
        self._preds: dict[Any, int] = {}
        self._succs: dict[Any, int] = {}
        self._executed: dict[Any, bool] = {}
        self._undone: dict[Any, bool] = {}
        self._state_undone: dict[Atom, bool] = {}  # the atom's own state alone
        self.candidates: set[Atom] = set()
        order = list(nx.topological_sort(self._graph))
        graph = self._graph
        forget_views(graph)  # the sort made some: see forget_views
        for node in order:
            count = sum(1 for p in graph.predecessors(node) if not self._executed[p])
            self._preds[node] = count
            if isinstance(node, Atom):
                self._executed[node] = atom_state[node.name] in EXECUTED_STATES
                if count == 0:
                    self.candidates.add(node)
            else:
                self._executed[node] = count == 0
        for node in reversed(order):
            count = sum(1 for s in graph.successors(node) if not self._undone[s])
            self._succs[node] = count
            if isinstance(node, Atom):
                self._state_undone[node] = atom_state[node.name] in UNDONE_STATES
                self._undone[node] = self._state_undone[node] and count == 0
                if count == 0:
                    self.candidates.add(node)
            else:
                self._undone[node] = count == 0

    def preds_done(self, atom: Atom) -> bool:
        """Whether every predecessor of ``atom`` has finished executing."""
        return self._preds[atom] == 0

    def succs_undone(self, atom: Atom) -> bool:
        """Whether every successor of ``atom`` has finished reverting (or never ran)."""
        return self._succs[atom] == 0

    def state_changed(self, atom: Atom, new_state: str) -> None:
        """Update the counters after ``atom`` moved to ``new_state``."""
        self.candidates.add(atom)
        executed = new_state in EXECUTED_STATES
        if executed != self._executed[atom]:
            self._executed[atom] = executed
            self._push_forward(atom, -1 if executed else 1)
        self._state_undone[atom] = new_state in UNDONE_STATES
        undone = self._state_undone[atom] and self._succs[atom] == 0
        if undone != self._undone[atom]:
            self._undone[atom] = undone
            self._push_backward(atom, -1 if undone else 1)

    def _push_forward(self, node: Any, delta: int) -> None:
        stack = [(node, delta)]
        graph, preds, executed = self._graph, self._preds, self._executed
        while stack:
            current, change = stack.pop()
            for succ in graph.successors(current):
                before = preds[succ]
                preds[succ] = after = before + change
                if isinstance(succ, Atom):
                    if after == 0:
                        self.candidates.add(succ)
                elif (before == 0) != (after == 0):
                    executed[succ] = after == 0
                    stack.append((succ, -1 if after == 0 else 1))

    def _push_backward(self, node: Any, delta: int) -> None:
        stack = [(node, delta)]
        graph, succs, undone = self._graph, self._succs, self._undone
        while stack:
            current, change = stack.pop()
            for pred in graph.predecessors(current):
                before = succs[pred]
                succs[pred] = after = before + change
                if isinstance(pred, Atom):
                    if after == 0:
                        self.candidates.add(pred)
                    if not self._state_undone[pred]:
                        continue
                if (before == 0) != (after == 0):
                    undone[pred] = after == 0
                    stack.append((pred, -1 if after == 0 else 1))

    def take_candidates(self) -> set[Atom]:
        """Return and clear the atoms whose readiness may have changed."""
        found, self.candidates = self.candidates, set()
        return found
