"""Linear flow: children run one after another, in the order they were added."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flowengine import flow

if TYPE_CHECKING:
    from flowengine.retry import Retry

_LINK = {flow.LINK_INVARIANT: True}


class Flow(flow.Flow):
    """Runs its children in order; each one sees what the ones before it provided."""

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        super().__init__(name, retry)
        self._children: list[flow.Item] = []
        self._seen: set[int] = set()

    def add(self, *items: flow.Item) -> Flow:
        """Append items (an item already present is ignored)."""
        for item in items:
            self._check_child(item)
            if id(item) not in self._seen:
                self._seen.add(id(item))
                self._children.append(item)
        return self

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[flow.Item]:
        return iter(self._children)

    def iter_links(self) -> Iterator[tuple[flow.Item, flow.Item, dict[str, Any]]]:
        for before, after in zip(self._children, self._children[1:]):
            yield before, after, dict(_LINK)
