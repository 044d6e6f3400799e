"""A finished engine is freed as soon as the program lets go of it, not by the cyclic collector.

An engine whose objects refer to each other in a cycle outlives its flow until a full
collection; a service running many flows then piles finished engines up, and each full
collection walks them all (doc/performance.rst). So no engine object may be part of a cycle:
flows run with the collector off, and what it then finds unreachable must hold no flowengine
object. Each engine is measured in an interpreter of its own (this file, run as a script):
in the test process, threads left by earlier tests may make garbage of their own meanwhile.
"""

from __future__ import annotations

import functools
import gc
import json
import pathlib
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable

import networkx as nx
import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
WAIT = 10.0


def _flow(number: int) -> object:
    """Linear, unordered and graph flows nested, with a retry controller: most of what an
    engine builds."""
    from behaviour import tasks

    from flowengine import retry
    from flowengine.flows import graph_flow, linear_flow, unordered_flow

    inner = unordered_flow.Flow(f"inner-{number}").add(tasks.Step("b"), tasks.Step("c"))
    retried = linear_flow.Flow(
        f"retried-{number}", retry=retry.Times(2, name="r", provides="attempt")).add(
        tasks.FailUntil("flaky", inject={"succeed_at": 1}))
    graph = graph_flow.Flow(f"graph-{number}").add(
        tasks.Step("d", provides="x"), tasks.Scale("e"))
    return linear_flow.Flow(f"flow-{number}").add(tasks.Step("a"), inner, retried, graph)


def _engine_garbage(run: Callable[[], None]) -> list[str]:
    """The flowengine objects the collector finds unreachable after ``run()`` (a fresh
    engine's run) with the collector off."""
    run()  # the first one fills caches and imports
    gc.collect()
    gc.disable()
    for _ in range(3):
        run()
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    return sorted({type(o).__module__ + "." + type(o).__qualname__ for o in gc.garbage
                   if type(o).__module__.startswith("flowengine")})


def _measure(kind: str) -> list[str]:
    """Run flows on a ``kind`` engine (a worker on kombu's memory transport for the
    worker-based one) and return :func:`_engine_garbage`."""
    from behaviour import tasks

    from flowengine import engines, states
    from flowengine.worker_based import worker as wk

    options: dict[str, object] = {}
    if kind == "worker-based":
        exchange = f"garbage-{uuid.uuid4().hex[:8]}"
        served = wk.Worker(exchange, "garbage", [tasks.Step, tasks.FailUntil, tasks.Scale],
                           threads_count=2, transport="memory")
        threading.Thread(target=functools.partial(served.run, display_banner=False),
                         daemon=True).start()
        assert served.wait(WAIT)
        options = {"exchange": exchange, "topics": ["garbage"], "transport": "memory"}

    def run() -> None:
        engine = engines.load(_flow(0), engine=kind, **options)
        engine.run()
        assert engine.storage.get_flow_state() == states.SUCCESS

    return _engine_garbage(run)


@pytest.mark.parametrize("kind", ["serial", "parallel", "worker-based"])
def test_a_finished_engine_leaves_no_cycles(kind: str) -> None:
    proc = subprocess.run([sys.executable, __file__, kind], cwd=TESTS, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_graphs_keep_no_views_of_themselves() -> None:
    from flowengine.utils.cycle_free import UncachedDiGraph, forget_views

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


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    print(json.dumps(_measure(sys.argv[1])))
