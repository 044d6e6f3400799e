"""The flow base class: a named, ordered container of atoms and other flows."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flowengine.atom import Atom

if TYPE_CHECKING:
    from flowengine.retry import Retry

# Keys of the metadata attached to links between a flow's items.
LINK_INVARIANT = "invariant"
LINK_MANUAL = "manual"
LINK_RETRY = "retry"
LINK_DECIDER = "decider"
LINK_DECIDER_DEPTH = "decider_depth"
LINK_REASONS = "reasons"

Item = Any  # an Atom or a Flow; typed loosely because flows nest.


def check_item(flow_name: str, item: object) -> None:
    """Raise ``TypeError`` naming the flow unless ``item`` is an atom or a flow."""
    if not isinstance(item, (Atom, Flow)):
        raise TypeError(
            f"Flow {flow_name!r} can only contain atoms and flows, not {type(item).__name__}: "
            f"{item!r}"
        )


class Flow(metaclass=abc.ABCMeta):
    """A structure of atoms and flows; the patterns in ``flowengine.flows`` define the order.

    Args:
        name: the flow's name (used in notifications and persistence).
        retry: optional retry controller for failures inside this flow; if it has no name it is
            named ``<flow name>_retry``.
    """

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        self._name = str(name)
        self._retry = retry
        if retry is not None and retry.name is None:
            retry.name = self._name + "_retry"

    @property
    def name(self) -> str:
        """The flow's name."""
        return self._name

    @property
    def retry(self) -> Retry | None:
        """The flow's retry controller, or None."""
        return self._retry

    def _check_child(self, item: Item, deep: bool = False) -> None:
        """Refuse a non-item, this flow itself, and (if ``deep``) a flow that contains it.

        The deep search costs as much as walking ``item``, so only patterns that walk their
        children on ``add`` anyway use it; the compiler refuses what the others let in.
        """
        check_item(self.name, item)
        pending = [item]
        seen: set[int] = set()
        while pending:
            node = pending.pop()
            if node is self:
                what = "itself" if item is self else f"{item.name!r}, which contains it"
                raise ValueError(
                    f"Flow {self.name!r} cannot contain {what}: flows cannot be nested in "
                    f"each other"
                )
            if deep and isinstance(node, Flow) and id(node) not in seen:
                seen.add(id(node))
                pending.extend(child for child in node if isinstance(child, Flow))

    @abc.abstractmethod
    def add(self, *items: Item) -> Flow:
        """Add atoms or flows and return self."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of direct children."""

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Item]:
        """Iterate over the direct children."""

    @abc.abstractmethod
    def iter_links(self) -> Iterator[tuple[Item, Item, dict[str, Any]]]:
        """Iterate over ``(u, v, metadata)``: v may only start after u has finished."""

    def iter_nodes(self) -> Iterator[tuple[Item, dict[str, Any]]]:
        """Iterate over ``(child, metadata)`` pairs."""
        for item in self:
            yield item, {}

    @property
    def provides(self) -> frozenset[str]:
        """Every name some atom in this flow (or its retry) provides."""
        names: set[str] = set()
        if self._retry is not None:
            names.update(self._retry.provides)
        for item in self:
            names.update(item.provides)
        return frozenset(names)

    @property
    def requires(self) -> frozenset[str]:
        """Names this flow needs from outside (its atoms need them; nothing inside provides)."""
        needed: set[str] = set()
        provided: set[str] = set()
        if self._retry is not None:
            needed.update(self._retry.requires)
            provided.update(self._retry.provides)
        for item in self:
            needed.update(item.requires - provided)
            provided.update(item.provides)
        # A retry's own requirements stay, even those it provides itself (as in TaskFlow).
        return frozenset(needed)

    def __str__(self) -> str:
        # TaskFlow's format: the class's dotted name (short for the built-in patterns), quoted.
        cls_name = f"{type(self).__module__}.{type(self).__qualname__}"
        cls_name = cls_name.removeprefix("flowengine.flows.")
        return f'"{cls_name}: {self.name}(len={len(self)})"'

    def __repr__(self) -> str:
        return f"<{self} with {len(self)} items>"
