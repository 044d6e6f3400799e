"""The memory backend's records seen as TaskFlow's in-memory filesystem (``backend.memory``).

TaskFlow programs (its ``dump_memory_backend`` and ``switch_graph_flow`` examples, for one) walk
``MemoryBackend.memory`` as a tree of posix paths: ``/books/<uuid>``, ``/flow_details/<uuid>``,
``/atom_details/<uuid>``, with a book's flow details and a flow detail's atom details listed
under it as links to their own paths. This view builds that tree from the backend's tables when
asked, so the tables stay the one place records live.
"""

from __future__ import annotations

import collections
import copy
import posixpath
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from flowengine import exceptions as exc

_KINDS = ("books", "flow_details", "atom_details")


class _Node:
    def __init__(self, name: str, path: str, value: Any = None, target: str | None = None):
        self.name = name
        self.path = path
        self.value = value
        self.target = target
        self.children: list[_Node] = []

    def add(self, name: str, value: Any = None, target: str | None = None) -> _Node:
        child = _Node(name, posixpath.join(self.path, name), value, target)
        self.children.append(child)
        return child

    def walk(self) -> Iterator[_Node]:
        """Every descendant, breadth first, each level's children last added first.

        TaskFlow's tree walks that way, and ``ls_r`` lists what this yields.
        """
        queue = collections.deque(reversed(self.children))
        while queue:
            node = queue.popleft()
            yield node
            queue.extend(reversed(node.children))


class MemoryTree:
    """A read-only, TaskFlow-shaped view of a memory backend's records.

    Args:
        tables: returns the backend's tables (books, flows, atoms, book_flows, flow_atoms).
        locked: a context manager factory holding the backend's lock while the tree is built.
    """

    #: The tree's root path.
    root_path = posixpath.sep

    def __init__(self, tables: Callable[[], Any],
                 locked: Callable[[], AbstractContextManager[Any]]) -> None:
        self._tables = tables
        self._locked = locked

    @classmethod
    def normpath(cls, path: str) -> str:
        """Return ``path`` normalised; it must be absolute."""
        if not path:
            raise ValueError("This filesystem can only normalize paths that are not empty")
        if not path.startswith(cls.root_path):
            raise ValueError(f"This filesystem can only normalize paths that start with "
                             f"{cls.root_path}: '{path}' is not valid")
        return posixpath.normpath(path)

    @staticmethod
    def join(*pieces: str) -> str:
        """Join path segments."""
        return posixpath.sep.join(pieces)

    #: Split a path into ``(head, tail)``.
    split = staticmethod(posixpath.split)

    def _build(self) -> dict[str, _Node]:
        root = _Node(self.root_path, self.root_path)
        with self._locked():
            t = self._tables()
            if not any(t.all()):
                # TaskFlow makes its three directories when the backend is first used.
                return {self.root_path: root}
            dirs = {kind: root.add(kind) for kind in _KINDS}
            for uuid, record in t.books.items():
                book = dirs["books"].add(uuid, copy.deepcopy(record))
                for fd_uuid in t.book_flows.get(uuid, {}):
                    book.add(fd_uuid, target=self.join("", "flow_details", fd_uuid))
            for uuid, record in t.flows.items():
                flow = dirs["flow_details"].add(uuid, copy.deepcopy(record))
                for ad_uuid in t.flow_atoms.get(uuid, {}):
                    flow.add(ad_uuid, target=self.join("", "atom_details", ad_uuid))
            for uuid, record in t.atoms.items():
                dirs["atom_details"].add(uuid, copy.deepcopy(record))
        found = {self.root_path: root}
        found.update((node.path, node) for node in root.walk())
        return found

    def _node(self, path: str) -> tuple[_Node, dict[str, _Node]]:
        nodes = self._build()
        try:
            return nodes[self.normpath(path)], nodes
        except KeyError:
            raise exc.NotFound(f"Path '{path}' not found") from None

    def __getitem__(self, path: str) -> Any:
        node, nodes = self._node(path)
        # A link is followed to the record it names (links never point at links here).
        return nodes[node.target].value if node.target else node.value

    def get(self, path: str, default: Any = None) -> Any:
        """The value at ``path``, or ``default`` when there is none."""
        try:
            return self[path]
        except exc.NotFound:
            return default

    def __contains__(self, path: str) -> bool:
        return self.normpath(path) in self._build()

    def ls(self, path: str, absolute: bool = False) -> list[str]:
        """Names (or absolute paths) of ``path``'s children."""
        node, _ = self._node(path)
        return [child.path if absolute else child.name for child in node.children]

    def ls_r(self, path: str, absolute: bool = False) -> list[str]:
        """Paths of every descendant of ``path``, breadth first (relative to it by default)."""
        node, _ = self._node(path)
        if absolute:
            return [child.path for child in node.walk()]
        return [posixpath.relpath(child.path, node.path) for child in node.walk()]

    def pformat(self) -> str:
        """The tree drawn as text, one node a line, links marked with their target."""
        root, _ = self._node(self.root_path)
        lines = [root.name]

        def draw(node: _Node, prefix: str) -> None:
            for index, child in enumerate(node.children):
                last = index == len(node.children) - 1
                label = child.name if child.target is None else \
                    f"{child.name} (link to {child.target})"
                lines.append(f"{prefix}|__{label}")
                draw(child, prefix + ("   " if last else "|  "))

        draw(root, "")
        return "\n".join(lines)
