"""Engine benchmark: build+compile and run times for no-op flows, with peak memory.

Shapes: linear, unordered and chain-graph (each task requires the previous one's output);
sizes 100, 1,000 and 10,000; engines serial and parallel. Each configuration runs in its own
process so its peak RSS is its own. With ``--taskflow PYTHON`` the same workloads also run on
TaskFlow (sizes up to ``--taskflow-max``) for a ratio measured on the same machine.

``back_to_back``: ``--runs`` one-task flows run one after another on each engine (each with its
own engine, as a service running small operations does), in ms per run. It shows any fixed cost
per run, such as TaskFlow's parallel engine waiting about a second for its pool to shut down.

Prints one JSON document. Example::

    python benchmarks/engines.py --sizes 100 1000 10000 --taskflow /path/to/taskflow/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

# The workload, run in a child process; {lib} selects the import names.
_CHILD = r'''
import json, resource, sys, time
lib, shape, size, engine = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if lib == "taskflow":
    from taskflow import engines, task
    from taskflow.patterns import graph_flow as gf, linear_flow as lf, unordered_flow as uf
else:
    from flowengine import engines, task
    from flowengine.flows import graph_flow as gf, linear_flow as lf, unordered_flow as uf

class Noop(task.Task):
    def execute(self):
        return None

class Link(task.Task):
    def execute(self, prev):
        return prev

if shape == "back-to-back":
    started = time.perf_counter()
    for i in range(size):
        engines.run(uf.Flow("quick").add(Noop("t%d" % i)), engine=engine)
    print(json.dumps({"runs": size, "ms_per_run": (time.perf_counter() - started) * 1000 / size}))
    sys.exit(0)
started = time.perf_counter()
if shape == "linear":
    flow = lf.Flow("bench").add(*[Noop("t%d" % i) for i in range(size)])
elif shape == "unordered":
    flow = uf.Flow("bench").add(*[Noop("t%d" % i) for i in range(size)])
else:
    items = [Link("t0", provides="v0", rebind={"prev": "seed"})]
    items += [Link("t%d" % i, provides="v%d" % i, rebind={"prev": "v%d" % (i - 1)})
              for i in range(1, size)]
    flow = gf.Flow("bench").add(*items)
eng = engines.load(flow, engine=engine, store={"seed": 0})
eng.compile()
compiled = time.perf_counter()
eng.run()
finished = time.perf_counter()
print(json.dumps({
    "build_compile_s": compiled - started,
    "run_s": finished - compiled,
    "tasks_per_s": size / (finished - compiled),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
}))
'''


def run_one(python: str, lib: str, shape: str, size: int, engine: str,
            timeout: float) -> dict[str, object]:
    """Run one configuration in a fresh process; return its measurements (or an error)."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [python, "-c", _CHILD, lib, shape, str(size), engine],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.monotonic() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--shapes", nargs="+", default=["linear", "unordered", "chain-graph"])
    parser.add_argument("--engines", nargs="+", default=["serial", "parallel"])
    parser.add_argument("--taskflow", metavar="PYTHON",
                        default=os.environ.get("TASKFLOW_PYTHON"),
                        help="an interpreter with taskflow installed, for the comparison")
    parser.add_argument("--taskflow-max", type=int, default=1000,
                        help="largest size to run on TaskFlow (it is slow)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--runs", type=int, default=20,
                        help="one-task flows run back to back on each engine (0: skip)")
    args = parser.parse_args()
    results = []
    for shape in args.shapes:
        for size in args.sizes:
            for engine in args.engines:
                row: dict[str, object] = {"shape": shape, "size": size, "engine": engine}
                row["flowengine"] = run_one(sys.executable, "flowengine", shape, size, engine,
                                            args.timeout)
                if args.taskflow and size <= args.taskflow_max:
                    tf = run_one(args.taskflow, "taskflow", shape, size, engine, args.timeout)
                    row["taskflow"] = tf
                    fe = row["flowengine"]
                    if isinstance(fe, dict) and "run_s" in fe and "run_s" in tf:
                        row["speedup_run"] = float(tf["run_s"]) / float(fe["run_s"])  # type: ignore[arg-type]
                        row["speedup_build_compile"] = (
                            float(tf["build_compile_s"]) / float(fe["build_compile_s"]))  # type: ignore[arg-type]
                results.append(row)
                print(json.dumps(row), file=sys.stderr)
    back_to_back = []
    for engine in args.engines if args.runs > 0 else []:
        row = {"engine": engine, "flowengine": run_one(sys.executable, "flowengine",
                                                       "back-to-back", args.runs, engine,
                                                       args.timeout)}
        if args.taskflow:
            row["taskflow"] = run_one(args.taskflow, "taskflow", "back-to-back", args.runs,
                                      engine, args.timeout)
        back_to_back.append(row)
        print(json.dumps(row), file=sys.stderr)
    print(json.dumps({
        "benchmark": "engines",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "results": results,
        "back_to_back": back_to_back,
    }, indent=2))


if __name__ == "__main__":
    main()
