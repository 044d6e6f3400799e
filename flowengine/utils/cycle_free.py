"""Keeping an engine's objects out of reference cycles, so it is freed as soon as it is let go.

CPython frees an object the moment nothing refers to it, except for objects that refer to each
other in a cycle: those wait for the cyclic collector. In a process running many flows, the
finished engines caught in cycles pile up until a full collection walks the whole heap, again
and again (doc/performance.rst, "Finished engines freed at once"). Two sources of cycles are
general enough to need a tool:

* an engine hands its own bound methods to objects it owns (its executor, its hooks), and
  each such callback refers back to the engine: a :class:`WeakMethod` callback reaches its
  object only while the owner keeps it alive;
* networkx caches the views of a graph it makes on first use (``graph.edges``,
  ``graph.in_degree``...) in the graph itself, and some of them refer back to the graph:
  :func:`forget_views` drops them once an algorithm is done (the compiled graph of an engine,
  read on every step, keeps networkx's fast views), and :class:`UncachedDiGraph` makes them
  afresh on each use and never holds one (a graph flow's own graph, read only as it is
  compiled).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Generic, ParamSpec, TypeVar

import networkx as nx

__all__ = ["UncachedDiGraph", "WeakMethod", "forget_views"]

P = ParamSpec("P")
R = TypeVar("R")


class WeakMethod(Generic[P, R]):
    """Calls ``method`` (a bound method) while its object lives; returns ``gone`` after.

    Args:
        method: The bound method to call.
        gone: What a call returns once the method's object has been freed.
    """

    __slots__ = ("_ref", "_gone", "__weakref__")

    def __init__(self, method: Callable[P, R], gone: R) -> None:
        self._ref = weakref.WeakMethod(method)  # type: ignore[arg-type]
        self._gone = gone

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        method = self._ref()
        if method is None:
            return self._gone
        return method(*args, **kwargs)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        method = self._ref()
        return f"WeakMethod({method!r})" if method is not None else "WeakMethod(<gone>)"


def _cached_views() -> tuple[tuple[str, functools.cached_property], ...]:  # type: ignore[type-arg]
    found: dict[str, functools.cached_property] = {}  # type: ignore[type-arg]
    for klass in reversed(nx.DiGraph.__mro__):  # a subclass's definition wins
        found.update((name, member) for name, member in vars(klass).items()
                     if isinstance(member, functools.cached_property))
    return tuple(found.items())


#: The views networkx caches on a DiGraph: each name, and how the view is made.
_DIGRAPH_VIEWS = _cached_views()


def forget_views(graph: nx.DiGraph) -> None:
    """Drop the views networkx keeps on ``graph`` once used (they are made again when next
    used)."""
    for name, _view in _DIGRAPH_VIEWS:
        graph.__dict__.pop(name, None)


class UncachedDiGraph(nx.DiGraph):  # type: ignore[misc]
    """A :class:`networkx.DiGraph` whose views (``nodes``, ``edges``, ``in_degree``...) are
    made on each use and never kept in it, so it is never a reference cycle of its own."""


def _make_views_uncached(graph_class: type[nx.DiGraph]) -> None:
    """Give ``graph_class`` a plain property for each view networkx caches: the same view,
    made on each use."""
    for name, view in _DIGRAPH_VIEWS:
        setattr(graph_class, name, property(view.func, doc=view.__doc__))


_make_views_uncached(UncachedDiGraph)
