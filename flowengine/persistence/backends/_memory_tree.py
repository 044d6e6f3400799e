"""TaskFlow's in-memory filesystem, and the memory backend's records seen as one.

TaskFlow programs (its ``dump_memory_backend`` and ``switch_graph_flow`` examples, for one) walk
``MemoryBackend.memory`` as a tree of posix paths: ``/books/<uuid>``, ``/flow_details/<uuid>``,
``/atom_details/<uuid>``, with a book's flow details and a flow detail's atom details listed
under it as links to their own paths. :class:`FakeFilesystem` is that tree (TaskFlow's
``impl_memory.FakeFilesystem``); :class:`MemoryTree` builds one from the backend's tables when
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
    def __init__(self, name: str, path: str, value: Any = None) -> None:
        self.name = name
        self.path = path
        self.value = value
        self.target: str | None = None
        self.children: list[_Node] = []

    def walk(self) -> Iterator[_Node]:
        """Every descendant, breadth first, each level's children last added first.

        TaskFlow's tree walks that way, and ``ls_r`` lists what this yields.
        """
        queue = collections.deque(reversed(self.children))
        while queue:
            node = queue.popleft()
            yield node
            queue.extend(reversed(node.children))


class FakeFilesystem:
    """A tree of values addressed by absolute posix paths, with links (TaskFlow's API).

    Args:
        deep_copy: store and return deep copies of values (else shallow ones).
    """

    #: The tree's root path.
    root_path = posixpath.sep

    def __init__(self, deep_copy: bool = True) -> None:
        self._copy: Callable[[Any], Any] = copy.deepcopy if deep_copy else copy.copy
        self._root = _Node(self.root_path, self.root_path)
        self._nodes = {self.root_path: self._root}

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

    @staticmethod
    def split(path: str) -> tuple[str, str]:
        """Split a path into ``(head, tail)``."""
        return posixpath.split(path)

    def _node(self, path: str) -> _Node:
        try:
            return self._nodes[self.normpath(path)]
        except KeyError:
            raise exc.NotFound(f"Path '{path}' not found") from None

    def _child(self, parent: _Node, name: str, value: Any = None) -> _Node:
        node = _Node(name, posixpath.join(parent.path, name), value)
        parent.children.append(node)
        self._nodes[node.path] = node
        return node

    def ensure_path(self, path: str) -> None:
        """Create ``path`` and its missing parents (with no value)."""
        node = self._root
        for piece in self.normpath(path).split(posixpath.sep)[1:]:
            if not piece:
                continue
            found = self._nodes.get(posixpath.join(node.path, piece))
            node = found if found is not None else self._child(node, piece)

    def __setitem__(self, path: str, value: Any) -> None:
        path = self.normpath(path)
        if path in self._nodes:
            self._nodes[path].value = self._copy(value)
            return
        parent_path, name = self.split(path)
        self._child(self._node(parent_path), name, self._copy(value))

    def __getitem__(self, path: str) -> Any:
        node = self._node(path)
        followed = [node.path]
        while node.target is not None:
            if node.target in followed:
                raise ValueError(f"Recursive link following not allowed (loop "
                                 f"{followed + [node.target]} detected)")
            followed.append(node.target)
            node = self._node(node.target)
        return self._copy(node.value)

    def get(self, path: str, default: Any = None) -> Any:
        """The value at ``path``, or ``default`` when there is none."""
        try:
            return self[path]
        except exc.NotFound:
            return default

    def __contains__(self, path: str) -> bool:
        return self.normpath(path) in self._nodes

    def symlink(self, src_path: str, dest_path: str) -> None:
        """Make ``dest_path`` a link to ``src_path`` (created when missing)."""
        dest_path, src_path = self.normpath(dest_path), self.normpath(src_path)
        node = self._nodes.get(dest_path)
        if node is None:
            parent_path, name = self.split(dest_path)
            node = self._child(self._node(parent_path), name)
        node.target = src_path

    def ls(self, path: str, absolute: bool = False) -> list[str]:
        """Names (or absolute paths) of ``path``'s children."""
        node = self._node(path)
        return [child.path if absolute else child.name for child in node.children]

    def ls_r(self, path: str, absolute: bool = False) -> list[str]:
        """Paths of every descendant of ``path``, breadth first (relative to it by default)."""
        node = self._node(path)
        if absolute:
            return [child.path for child in node.walk()]
        return [posixpath.relpath(child.path, node.path) for child in node.walk()]

    def delete(self, path: str, recursive: bool = False) -> None:
        """Remove ``path`` (with its descendants when ``recursive``; never the root itself)."""
        node = self._node(path)
        if node is self._root and not recursive:
            raise ValueError(f"Can not delete '{node.path}'")
        if node.children and not recursive:
            raise ValueError(f"Can not delete '{node.path}', it has {len(node.children)} "
                             f"children")
        for child in node.walk():
            self._nodes.pop(child.path, None)
        if node is self._root:
            node.children.clear()
            return
        self._nodes.pop(node.path, None)
        self._nodes[self.split(node.path)[0]].children.remove(node)

    def __delitem__(self, path: str) -> None:
        self.delete(path, recursive=True)

    def clear(self) -> None:
        """Remove everything but the root."""
        self.delete(self.root_path, recursive=True)

    def pformat(self) -> str:
        """The tree drawn as text, one node a line, links marked with their target."""
        lines = [self._root.name]

        def draw(node: _Node, prefix: str) -> None:
            for index, child in enumerate(node.children):
                last = index == len(node.children) - 1
                label = child.name if child.target is None else \
                    f"{child.name} (link to {child.target})"
                lines.append(f"{prefix}|__{label}")
                draw(child, prefix + ("   " if last else "|  "))

        draw(self._root, "")
        return "\n".join(lines)


class MemoryTree:
    """The memory backend's records as a (read-only) :class:`FakeFilesystem`, built on access.

    Args:
        tables: returns the backend's tables (books, flows, atoms, book_flows, flow_atoms).
        locked: a context manager factory holding the backend's lock while the tree is built.
    """

    #: The tree's root path.
    root_path = FakeFilesystem.root_path
    normpath = FakeFilesystem.normpath
    join = staticmethod(FakeFilesystem.join)
    split = staticmethod(FakeFilesystem.split)

    def __init__(self, tables: Callable[[], Any],
                 locked: Callable[[], AbstractContextManager[Any]]) -> None:
        self._tables = tables
        self._locked = locked

    def _build(self) -> FakeFilesystem:
        fs = FakeFilesystem()
        with self._locked():
            t = self._tables()
            if not any(t.all()):
                return fs  # TaskFlow makes its three directories when the backend is first used
            for kind in _KINDS:
                fs.ensure_path(self.join("", kind))
            for uuid, record in t.books.items():
                fs[f"/books/{uuid}"] = record
                for fd_uuid in t.book_flows.get(uuid, {}):
                    fs.symlink(f"/flow_details/{fd_uuid}", f"/books/{uuid}/{fd_uuid}")
            for uuid, record in t.flows.items():
                fs[f"/flow_details/{uuid}"] = record
                for ad_uuid in t.flow_atoms.get(uuid, {}):
                    fs.symlink(f"/atom_details/{ad_uuid}", f"/flow_details/{uuid}/{ad_uuid}")
            for uuid, record in t.atoms.items():
                fs[f"/atom_details/{uuid}"] = record
        return fs

    def __getitem__(self, path: str) -> Any:
        return self._build()[path]

    def get(self, path: str, default: Any = None) -> Any:
        """The value at ``path``, or ``default`` when there is none."""
        return self._build().get(path, default)

    def __contains__(self, path: str) -> bool:
        return path in self._build()

    def ls(self, path: str, absolute: bool = False) -> list[str]:
        """Names (or absolute paths) of ``path``'s children."""
        return self._build().ls(path, absolute)

    def ls_r(self, path: str, absolute: bool = False) -> list[str]:
        """Paths of every descendant of ``path``, breadth first (relative to it by default)."""
        return self._build().ls_r(path, absolute)

    def pformat(self) -> str:
        """The tree drawn as text, one node a line, links marked with their target."""
        return self._build().pformat()
