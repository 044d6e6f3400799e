"""A finished engine is freed as soon as the program lets go of it, not by the cyclic collector.

An engine whose objects refer to each other in a cycle outlives its flow until a full
collection; a service running many flows then piles finished engines up, and each full
collection walks them all (doc/performance.rst). So no engine object may be part of a cycle:
the flows here run with the collector off, and what it then finds unreachable must hold no
flowengine object.
"""

from __future__ import annotations

import functools
import gc
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import networkx as nx
import pytest
from behaviour import tasks  # tests/ is on sys.path (rootdir conftest)

from flowengine import engines, retry, states
from flowengine.flows import graph_flow, linear_flow, unordered_flow
from flowengine.utils.cycle_free import UncachedDiGraph, forget_views
from flowengine.worker_based import worker as wk

WAIT = 10.0


def _flow(number: int) -> Any:
    """Linear, unordered and graph flows nested, with a retry controller and a failure it
    retries: most of what an engine builds."""
    inner = unordered_flow.Flow(f"inner-{number}").add(tasks.Step("b"), tasks.Step("c"))
    retried = linear_flow.Flow(
        f"retried-{number}", retry=retry.Times(2, name="r", provides="attempt")).add(
        tasks.FailUntil("flaky", inject={"succeed_at": 1}))
    graph = graph_flow.Flow(f"graph-{number}").add(
        tasks.Step("d", provides="x"), tasks.Scale("e"))
    return linear_flow.Flow(f"flow-{number}").add(tasks.Step("a"), inner, retried, graph)


def _engine_garbage(run: Any) -> list[str]:
    """The flowengine objects the collector finds unreachable after ``run()`` (a fresh
    engine's run) with the collector off."""
    run()  # the first one fills caches and imports
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = sorted({type(o).__module__ + "." + type(o).__qualname__ for o in gc.garbage
                        if type(o).__module__.startswith("flowengine")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    return found


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_a_local_engine_leaves_no_cycles(kind: str) -> None:
    def run() -> None:
        engine = engines.load(_flow(0), engine=kind)
        engine.run()
        assert engine.storage.get_flow_state() == states.SUCCESS

    assert _engine_garbage(run) == []


@pytest.fixture
def worker() -> Iterator[tuple[str, wk.Worker]]:
    exchange = f"garbage-{uuid.uuid4().hex[:8]}"
    served = wk.Worker(exchange, "garbage", [tasks.Step, tasks.FailUntil, tasks.Scale],
                       threads_count=2, transport="memory")
    thread = threading.Thread(target=functools.partial(served.run, display_banner=False),
                              daemon=True)
    thread.start()
    assert served.wait(WAIT)
    try:
        yield exchange, served
    finally:
        served.stop(grace=WAIT)
        thread.join(WAIT)


def test_a_worker_based_engine_leaves_no_cycles(worker: tuple[str, wk.Worker]) -> None:
    exchange, _served = worker

    def run() -> None:
        engine = engines.load(_flow(0), engine="worker-based", exchange=exchange,
                              topics=["garbage"], transport="memory")
        engine.run()
        assert engine.storage.get_flow_state() == states.SUCCESS

    assert _engine_garbage(run) == []


def test_graphs_keep_no_views_of_themselves() -> None:
    def used(graph: nx.DiGraph) -> nx.DiGraph:
        graph.add_edge("a", "b")
        assert list(nx.topological_sort(graph)) == ["a", "b"]  # uses graph.in_degree
        assert list(graph.edges) == [("a", "b")] and graph.in_degree("b") == 1
        return graph

    kept = used(nx.DiGraph())
    assert {"edges", "in_degree"} <= set(vars(kept)), "networkx no longer caches its views"
    forget_views(kept)
    assert not {"edges", "in_degree", "nodes"} & set(vars(kept))
    assert list(kept.edges) == [("a", "b")]  # made again on use
    fresh = used(UncachedDiGraph())
    assert not {"edges", "in_degree", "nodes", "adj"} & set(vars(fresh))
