"""networkx graphs that do not keep themselves alive.

networkx caches the views of a graph it makes on first use (``graph.edges``,
``graph.in_degree``...) in the graph itself, and some of them refer back to the graph. The
graph, and every atom and flow in it, is then a reference cycle: it outlives whoever held it
until the cyclic collector finds it, and in a process running many flows the finished flows
pile up until a full collection walks the whole heap again and again (doc/performance.rst).

:func:`forget_views` drops the cached views of a graph once an algorithm is done with them
(the compiled graph of an engine, read on every step, keeps networkx's fast views);
:class:`UncachedDiGraph` makes its views afresh on each use and never holds one (a graph flow's
own graph, read only as it is compiled).
"""

from __future__ import annotations

import functools

import networkx as nx

__all__ = ["UncachedDiGraph", "forget_views"]


def _cached_views(graph_class: type[nx.DiGraph]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(
        name for klass in graph_class.__mro__ for name, member in vars(klass).items()
        if isinstance(member, functools.cached_property)))


#: The names of the views networkx caches on a DiGraph.
_DIGRAPH_VIEWS = _cached_views(nx.DiGraph)


def forget_views(graph: nx.DiGraph) -> None:
    """Drop the views networkx keeps on ``graph`` once used (they are made again when next
    used)."""
    names = _DIGRAPH_VIEWS if type(graph) is nx.DiGraph else _cached_views(type(graph))
    for name in names:
        graph.__dict__.pop(name, None)


class UncachedDiGraph(nx.DiGraph):  # type: ignore[misc]
    """A :class:`networkx.DiGraph` whose views (``nodes``, ``edges``, ``in_degree``...) are
    made on each use and never kept in it, so it is never a reference cycle of its own."""


def _make_views_uncached(graph_class: type[nx.DiGraph]) -> None:
    """Give ``graph_class`` a plain property for each view networkx caches: the same view,
    made on each use."""
    for name in _DIGRAPH_VIEWS:
        cached = next(vars(klass)[name] for klass in nx.DiGraph.__mro__
                      if isinstance(vars(klass).get(name), functools.cached_property))
        setattr(graph_class, name, property(cached.func, doc=cached.__doc__))


_make_views_uncached(UncachedDiGraph)
