"""Unordered flow: children are independent and may run in any order, or at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flowengine import flow

if TYPE_CHECKING:
    from flowengine.retry import Retry


class Flow(flow.Flow):
    """Runs its children with no ordering between them (in parallel on a parallel engine).

    Children cannot see each other's results; only what comes from outside the flow.
    """

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        super().__init__(name, retry)
        self._children: dict[int, flow.Item] = {}

    def add(self, *items: flow.Item) -> Flow:
        """Add items (an item already present is ignored)."""
        for item in items:
            self._check_child(item)
            self._children.setdefault(id(item), item)
        return self

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[flow.Item]:
        return iter(self._children.values())

    def iter_links(self) -> Iterator[tuple[flow.Item, flow.Item, dict[str, Any]]]:
        return iter(())

    @property
    def requires(self) -> frozenset[str]:
        """Everything any child needs, except what the flow's retry provides."""
        retry_provides = self.retry.provides if self.retry is not None else frozenset()
        needed: set[str] = set()
        for item in self:
            needed.update(item.requires - retry_provides)
        if self.retry is not None:
            needed.update(self.retry.requires)  # even those it provides itself (TaskFlow)
        return frozenset(needed)
