"""What setting a flow up costs, stage by stage, and what a compile-once-per-shape cache could save.

Issue 26 asks that a service running the same few flow shapes thousands of times pay, for each
new flow, only its storage records and its run. This script measures where a new flow's set-up
goes before anything runs: for each engine (serial, worker-based; the worker-based engine is
only set up here, so no broker is needed) and each size of a linear flow of no-op tasks, the
median CPU time of the calling thread (``time.thread_time``, so other processes on the machine
do not count) of each stage on a fresh flow: ``build`` (making the flow's objects),
``load`` (``engines.load``), ``compile``, ``prepare`` (the storage records) and ``validate``.

Next to them, per size: ``pattern_compile_ms``, the compiler alone (networkx graph and checks),
and ``graph_copy_ms``, copying a compiled graph onto a new flow's atoms
(``networkx.relabel_nodes``): the least a per-shape cache would still pay per flow, since a
compiled graph holds the flow's own atom objects. The difference of the two is the most such a
cache could save. The collector runs as usual (stages that allocate pay for it, as in a real
service). Prints one JSON document. Example::

    python benchmarks/setup_cost.py
    python benchmarks/setup_cost.py --sizes 3 1000 --flows 200
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import networkx as nx  # noqa: E402

from flowengine import engines, task  # noqa: E402
from flowengine.engines.compiler import PatternCompiler  # noqa: E402
from flowengine.flows import linear_flow  # noqa: E402

STAGES = ("build", "load", "compile", "prepare", "validate")
#: What the worker-based engine is given: its set-up contacts no broker.
WORKER_BASED = {"transport": "memory", "exchange": "setup-cost", "topics": ["setup-cost"]}


class Noop(task.Task):
    """Does nothing (never run here)."""

    def execute(self) -> None:
        return None


def build(size: int) -> linear_flow.Flow:
    return linear_flow.Flow("shape").add(*[Noop(f"t{i}") for i in range(size)])


def cpu_ms(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """``fn(*args, **kwargs)`` and the calling thread's CPU milliseconds it took."""
    start = time.thread_time()
    result = fn(*args, **kwargs)
    return (time.thread_time() - start) * 1000, result


def stages(engine_name: str, size: int, flows: int) -> dict[str, float]:
    options = WORKER_BASED if engine_name == "worker-based" else {}
    times: dict[str, list[float]] = {stage: [] for stage in STAGES}
    warm = max(flows // 5, 2)
    for number in range(flows + warm):
        spent, flow = cpu_ms(build, size)
        row = {"build": spent}
        spent, engine = cpu_ms(engines.load, flow, engine=engine_name, **options)
        row["load"] = spent
        for stage in ("compile", "prepare", "validate"):
            row[stage], _ = cpu_ms(getattr(engine, stage))
        if number >= warm:  # the first flows pay for imports and caches
            for stage, spent in row.items():
                times[stage].append(spent)
    medians = {f"{stage}_ms": round(statistics.median(values), 4)
               for stage, values in times.items()}
    medians["set_up_ms"] = round(sum(medians[f"{s}_ms"] for s in STAGES if s != "build"), 4)
    return medians


def compile_parts(size: int, flows: int) -> dict[str, float]:
    compiled = PatternCompiler(build(size)).compile().execution_graph
    fresh = [build(size) for _ in range(flows)]
    compiles, copies = [], []
    for flow in fresh:
        spent, _ = cpu_ms(PatternCompiler(flow).compile)
        compiles.append(spent)
        atoms = {node.name: node for node, _meta in flow.iter_nodes()}
        mapping = {node: atoms.get(getattr(node, "name", None), node) for node in compiled}
        spent, _ = cpu_ms(nx.relabel_nodes, compiled, mapping, copy=True)
        copies.append(spent)
    return {"pattern_compile_ms": round(statistics.median(compiles), 4),
            "graph_copy_ms": round(statistics.median(copies), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 100, 1000])
    parser.add_argument("--engines", nargs="+", default=["serial", "worker-based"],
                        choices=["serial", "worker-based"])
    parser.add_argument("--flows", type=int, default=300,
                        help="fresh flows per size (fewer when large: 3,000 atoms, at least 10)")
    args = parser.parse_args()
    results = []
    for size in args.sizes:
        flows = max(10, min(args.flows, 3000 // max(size, 1)))
        row: dict[str, Any] = {"size": size, "flows": flows, **compile_parts(size, flows)}
        for engine_name in args.engines:
            row[engine_name] = stages(engine_name, size, flows)
        results.append(row)
    print(json.dumps({"benchmark": "setup_cost", "python": platform.python_version(),
                      "machine": platform.machine(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
