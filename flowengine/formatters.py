"""Turn an atom's failure into text that says where in the flow it happened.

:class:`FailureFormatter` shows, for an atom that failed while executing, the atoms and flows
that ran before it (its predecessors in the execution graph, nearest first) with each atom's
intention, state, arguments and result, e.g.::

    3 predecessors (most recent first):
      Atom 'fetch' {'intention': 'EXECUTE', 'state': 'SUCCESS', 'requires': {}, 'provides': 1}
      |__Flow 'main'
      Atom 'check' {...}

An atom reached along several paths is expanded only the first time; later occurrences end
with ``(see above)``, which keeps the text linear in the size of the flow.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.atom import Atom
from flowengine.engines import compiler
from flowengine.types.failure import Failure

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine
    from flowengine.storage import Storage

__all__ = ["AtomMatcher", "FailureFormatter"]

#: Picks the failed atom out of the flow's atoms.
AtomMatcher = Callable[[Atom], bool]

_MASK = "***"
_NOT_FOUND = object()


class _Predecessor:
    """One node of the predecessor tree: a flow start or an atom, and what ran before it."""

    __slots__ = ("node", "kind", "children", "repeated")

    def __init__(self, node: Any, kind: str, repeated: bool = False) -> None:
        self.node = node
        self.kind = kind
        self.children: list[_Predecessor] = []
        self.repeated = repeated


def _direct_predecessors(graph: Any, node: Any) -> list[tuple[Any, str]]:
    """``(node, kind)`` of what precedes ``node``, looking through flow end nodes."""
    found: list[tuple[Any, str]] = []
    pending = list(reversed(list(graph.predecessors(node))))
    while pending:
        pred = pending.pop()
        kind = graph.nodes[pred]["kind"]
        if kind == compiler.FLOW_END:
            # A flow's end node only joins its children's exits: show those instead.
            pending.extend(reversed(list(graph.predecessors(pred))))
        else:
            found.append((pred, kind))
    return found


def _predecessor_tree(graph: Any, atom: Atom) -> tuple[list[_Predecessor], int]:
    """The predecessors of ``atom`` as a forest, and how many distinct nodes it holds.

    Iterative, not recursive: a long linear flow is a chain as deep as it is long.
    """
    roots: list[_Predecessor] = []
    expanded: set[int] = set()
    stack = [(pred, kind, roots) for pred, kind in reversed(_direct_predecessors(graph, atom))]
    while stack:
        node, kind, siblings = stack.pop()
        seen = id(node) in expanded
        child = _Predecessor(node, kind, repeated=seen)
        siblings.append(child)
        if not seen:
            expanded.add(id(node))
            preds = _direct_predecessors(graph, node)
            stack.extend((pred, k, child.children) for pred, k in reversed(preds))
    return roots, len(expanded)


def _render(roots: list[_Predecessor], label: Callable[[_Predecessor], str]) -> Iterator[str]:
    """Yield the lines of a forest drawn with ``|__`` branches, each tree indented by two."""
    # Entries: (node, text before its label, prefix its own children's lines start with).
    stack = [(root, "  ", "  ") for root in reversed(roots)]
    while stack:
        node, lead, base = stack.pop()
        yield lead + label(node)
        count = len(node.children)
        for i in range(count - 1, -1, -1):
            # The vertical bar carries on below a child only while it has later siblings.
            below = base + ("   " if i == count - 1 else "|  ")
            stack.append((node.children[i], base + "|__", below))


def _mask_keys(data: Any, mask_keys: frozenset[str]) -> Any:
    """A copy of ``data`` where the values of ``mask_keys`` (at any depth) are ``***``."""
    if not mask_keys:
        return data
    if isinstance(data, dict):
        return {k: _MASK if k in mask_keys else _mask_keys(v, mask_keys) for k, v in data.items()}
    if isinstance(data, list):
        return [_mask_keys(item, mask_keys) for item in data]
    if type(data) is tuple:
        return tuple(_mask_keys(item, mask_keys) for item in data)
    return data


class FailureFormatter:
    """Formats a failure and connects it to the atoms of the engine it happened in.

    Args:
        engine: The engine the failure happened in.
        hide_inputs_outputs_of: Names of atoms whose arguments and results are never shown.
        mask_inputs_keys: Keys whose values are shown as ``***`` in atoms' arguments.
        mask_outputs_keys: Keys whose values are shown as ``***`` in atoms' results.
    """

    def __init__(
        self,
        engine: ActionEngine,
        hide_inputs_outputs_of: Iterable[str] = (),
        mask_inputs_keys: Iterable[str] = (),
        mask_outputs_keys: Iterable[str] = (),
    ) -> None:
        self._engine = engine
        self._hide_inputs_outputs_of = frozenset(hide_inputs_outputs_of)
        self._mask_inputs_keys = frozenset(mask_inputs_keys)
        self._mask_outputs_keys = frozenset(mask_outputs_keys)

    def format(self, fail: Failure, atom_matcher: AtomMatcher) -> tuple[Any, str]:
        """Describe ``fail``, which the atom ``atom_matcher`` picks out produced.

        Args:
            fail: The failure.
            atom_matcher: Called with each atom of the flow; the first one it accepts is the
                atom that failed. (TaskFlow's matcher receives a tree node; this one receives
                the atom itself.)

        Returns:
            ``(exc_info, details)``: the failure's ``(type, value, traceback)`` tuple (None for
            a failure received from elsewhere, whose traceback text is then in ``details``)
            and text about the failure, empty when there is nothing to add (for instance
            when the atom was no longer executing).
        """
        sections: list[str] = []
        if fail.exc_info is None:
            sections.append(fail.pformat(traceback=True))
        storage = self._engine.storage
        compilation = self._engine.compilation
        atom = next((a for a in compilation.iter_atoms() if atom_matcher(a)), None)
        if atom is not None and _lookup(storage.get_atom_intention, atom.name) == states.EXECUTE:
            roots, count = _predecessor_tree(compilation.execution_graph, atom)
            if roots:
                lines = [f"{count} predecessors (most recent first):"]
                lines.extend(_render(roots, lambda n: self._label(storage, n)))
                sections.append(os.linesep.join(lines))
        return fail.exc_info, storage.masker.text(os.linesep.join(sections))

    def _label(self, storage: Storage, node: _Predecessor) -> str:
        """The text of one tree node."""
        suffix = " (see above)" if node.repeated else ""
        if node.kind == compiler.FLOW:
            return f"Flow '{node.node.name}'{suffix}"
        if node.kind not in compiler.ATOMS:
            raise TypeError(
                f"Unable to format graph node {node.node!r} of unknown kind {node.kind!r}"
            )
        atom: Atom = node.node
        if node.repeated:
            return f"Atom '{atom.name}'{suffix}"
        attrs = self._atom_attrs(storage, atom)
        return f"Atom '{atom.name}' {attrs}" if attrs else f"Atom '{atom.name}'"

    def _atom_attrs(self, storage: Storage, atom: Atom) -> dict[str, Any]:
        """What storage knows about ``atom``: intention, state, arguments and result."""
        name = atom.name
        attrs: dict[str, Any] = {
            "intention": _lookup(storage.get_atom_intention, name),
            "state": _lookup(storage.get_atom_state, name),
        }
        if name not in self._hide_inputs_outputs_of:
            requires = _lookup(
                lambda: storage.fetch_mapped_args(
                    atom.rebind, atom_name=name, optional_args=atom.optional
                )
            )
            provides = _lookup(storage.get_execute_result, name)
            attrs["requires"] = storage.masked(_mask_keys(requires, self._mask_inputs_keys))
            attrs["provides"] = storage.masked(_mask_keys(provides, self._mask_outputs_keys))
        return {key: value for key, value in attrs.items() if value is not _NOT_FOUND}


def _lookup(fetch: Callable[..., Any], *args: Any) -> Any:
    """``fetch(*args)``, or ``_NOT_FOUND`` when storage has no such value."""
    try:
        return fetch(*args)
    except (exc.StorageFailure, exc.NotFound, exc.DisallowedAccess):
        return _NOT_FOUND
