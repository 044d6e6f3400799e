"""Many concurrent flows in one process: what the process-wide broker client buys.

An orchestration service runs many short flows at once, each loaded with
``engines.load(flow, engine="worker-based", ...)`` on its own thread. For each chosen broker
(redis, rabbitmq, fs = flowengine-fs) and each ``--flows`` count N, one engine process runs N
flows of 3 no-op tasks at once, each with its own engine on its own thread, against
``--workers`` ``flowengine worker`` processes. In the same engine process and run it also
measures one engine running the same number of tasks (an unordered flow of 3N no-op tasks, at
most ``--one-engine-cap``) and a lone 3-task flow (median of ``--lone`` runs on the warm client);
the raw kombu round trip is measured first on the same broker (``kombu_ceiling.py``).

Reported per N: ``all_finished``, ``wall_s``, ``flows_per_s``, ``tasks_per_s``,
``one_engine_tasks_per_s`` and their ratio, the engine process's ``peak_sockets`` and
``peak_library_threads`` (threads other than the flows' own and the main thread), its
``peak_rss_mb``; the engine process's CPU time per task (``cpu_ms_per_task``, against
``one_engine_cpu_ms_per_task``: ``cpu_ratio_vs_one_engine``, what the flows' own overhead
costs, steadier than the rates on a machine other work shares), the worker processes' CPU time
per task (``workers_cpu_ms_per_task`` and ``one_engine_workers_cpu_ms_per_task``, Linux: the
workers share the cores, so their cost bounds both rates), its context switches per task
and its full (generation 2) garbage collections and their seconds, for both runs; per broker
``lone_flow_ms`` against ``3 x`` the raw sequential round trip.

The rates of two runs seconds apart swing by a third on a machine other work shares, so each N
is measured in ``--pairs`` pairs (default 3) in the same process, alternated (N flows, one
engine, N flows, one engine, ...), each side started on a freshly collected heap (untimed),
so neither pays for collecting the other's garbage: ``pairs`` lists each pair's figures, and
the row's rates, ratios and CPU figures are the medians over the pairs
(``ratio_vs_one_engine`` the median of the pairs' ratios); peaks are the highest of any pair,
``all_finished`` holds for every pair.
``--redis-flows`` adds counts on Redis only (the 10,000-flow run). Targets (Redis): every flow
finishes, task rate at least 0.7 of one engine's, at most 16 sockets and 32 library threads
whatever N, a lone flow within 3x its raw round trips (``targets_met``). The remote wing's
rebuild (issue 26) asks more, reported beside them as ``rebuild_targets_met``: at 1,000 flows
on Redis a median ratio of at least 0.9 and no pair below 0.75, and on every broker a lone flow
within 2x its raw round trips. On RabbitMQ the round trip is measured a second time with
publisher confirms, which flowengine's requests and outcomes wait for and the raw one does not:
``lone_flow_vs_3_confirmed_round_trips`` is given for information. Prints one JSON document.
Example::

    python benchmarks/many_flows.py --brokers redis --flows 100 1000
    python benchmarks/many_flows.py --brokers redis --flows 10000 --pairs 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kombu_ceiling as ceiling  # noqa: E402
import wbe  # noqa: E402

#: Seconds each flow's requests may wait for a worker (10,000 flows queue a while).
TRANSITION_TIMEOUT = 900.0
TARGET_RATIO = 0.7
TARGET_SOCKETS = 16
TARGET_THREADS = 32
TARGET_LONE_X = 3.0
#: Issue 26's: at 1,000 flows the median ratio, and the lowest a pair may show.
REBUILD_RATIO, REBUILD_LOWEST_PAIR, REBUILD_FLOWS = 0.9, 0.75, 1000
#: Issue 26's: a lone flow within this many times its raw round trips, on every broker.
REBUILD_LONE_X = 2.0

_ENGINE_CHILD = r"""
import gc, json, os, resource, statistics, sys, threading, time
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["tasks_dir"])
from flowengine import engines, states
from flowengine.flows import linear_flow, unordered_flow
import wbe_bench_tasks as tasks

# Ten thousand flow threads: small stacks keep the process's memory about the engines.
threading.stack_size(512 * 1024)
RUNNER = "flow-runner-"


def sockets():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink("/proc/self/fd/" + fd).startswith("socket:")
        except OSError:
            pass
    return count


def library_threads():
    return sum(1 for t in threading.enumerate()
               if not t.name.startswith(RUNNER) and t is not threading.main_thread()
               and t.name != "peak-watcher")


def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


GC = {"full": 0, "seconds": 0.0, "started": 0.0}


def on_gc(phase, info):
    # Full collections walk every object of the process: what a thousand live engines cost.
    # The collecting thread's CPU time, not wall time: a callback is Python code, and among a
    # thousand threads the collector's thread can wait milliseconds for the GIL in it.
    if phase == "start":
        GC["started"] = time.thread_time()
    else:
        GC["seconds"] += time.thread_time() - GC["started"]
        GC["full"] += info["generation"] == 2


gc.callbacks.append(on_gc)


def workers_cpu():
    # The workers' CPU seconds (Linux /proc): they share the machine's cores with this process.
    total = 0.0
    for pid in cfg["worker_pids"]:
        try:
            with open("/proc/%d/stat" % pid) as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def counters():
    times, usage = os.times(), resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu": times.user + times.system, "switches": usage.ru_nvcsw + usage.ru_nivcsw,
            "full_gc": GC["full"], "gc_s": GC["seconds"], "at": time.perf_counter(),
            "workers_cpu": workers_cpu()}


def spent(before, tasks):
    after = counters()
    workers = None
    if before["workers_cpu"] is not None and after["workers_cpu"] is not None:
        workers = 1000 * (after["workers_cpu"] - before["workers_cpu"]) / max(tasks, 1)
    return {"wall_s": after["at"] - before["at"],
            "cpu_ms_per_task": 1000 * (after["cpu"] - before["cpu"]) / max(tasks, 1),
            "workers_cpu_ms_per_task": workers,
            "switches_per_task": (after["switches"] - before["switches"]) / max(tasks, 1),
            "full_gc": after["full_gc"] - before["full_gc"],
            "gc_s": round(after["gc_s"] - before["gc_s"], 3)}


def three(i):
    return linear_flow.Flow("f%d" % i).add(*[tasks.Noop("t%d" % k) for k in range(3)])


def one_engine(size):
    flow = unordered_flow.Flow("one").add(*[tasks.Noop("t%d" % k) for k in range(size)])
    engine = engines.load(flow, engine="worker-based", **cfg["engine_options"])
    engine.compile()
    engine.prepare()
    before = counters()
    engine.run()
    row = spent(before, size)
    row["tasks_per_s"] = size / row["wall_s"]
    return row


def many(n):
    peak = {"sockets": 0, "threads": 0, "rss_mb": 0.0}
    stop = threading.Event()

    def sample():
        peak["sockets"] = max(peak["sockets"], sockets())
        peak["threads"] = max(peak["threads"], library_threads())
        peak["rss_mb"] = max(peak["rss_mb"], rss_mb() or 0.0)

    def watch():
        while not stop.wait(0.05):
            sample()

    results = []
    gate = threading.Event()

    def run(i):
        engine = engines.load(three(i), engine="worker-based", **cfg["engine_options"])
        gate.wait()
        try:
            engine.run()
            results.append(engine.storage.get_flow_state())
        except Exception as err:
            results.append(f"{type(err).__name__}: {err}"[:300])

    watcher = threading.Thread(target=watch, name="peak-watcher", daemon=True)
    watcher.start()
    runners = [threading.Thread(target=run, args=(i,), name=RUNNER + str(i), daemon=True)
               for i in range(n)]
    for runner in runners:
        runner.start()
    before = counters()
    gate.set()
    deadline = time.monotonic() + cfg["timeout"]
    for runner in runners:
        runner.join(max(deadline - time.monotonic(), 0.01))
    done = sum(1 for r in results if r == states.SUCCESS)
    row = spent(before, 3 * done)
    stop.set()
    watcher.join()
    # A run shorter than the watcher's period may have gone unsampled; the shared client lingers
    # after its last engine leaves, so a sample taken now still sees what the run held.
    sample()
    row.update({
        "flows": n, "finished": done, "all_finished": done == n,
        "flows_per_s": done / row["wall_s"], "tasks_per_s": 3 * done / row["wall_s"],
        "peak_sockets": peak["sockets"], "peak_library_threads": peak["threads"],
        "peak_rss_mb": round(peak["rss_mb"], 1),
        "failures": sorted({str(r) for r in results if r != states.SUCCESS}),
    })
    return row


def median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def measure(n):
    # Alternated in one process, so both sides of every pair see the same machine load.
    tasks = min(3 * n, cfg["one_engine_cap"])
    pairs = []
    for _ in range(cfg["pairs"]):
        # Each side starts from a collected heap, untimed: neither pays for collecting the
        # other's garbage (a thousand finished engines, or 3N finished requests).
        gc.collect()
        flows = many(n)
        gc.collect()
        one = one_engine(tasks)
        flows["one_engine"] = one
        flows["ratio_vs_one_engine"] = flows["tasks_per_s"] / one["tasks_per_s"]
        flows["cpu_ratio_vs_one_engine"] = (  # CPU times tick in 10 ms: a tiny run may read 0
            one["cpu_ms_per_task"] / flows["cpu_ms_per_task"] if flows["cpu_ms_per_task"]
            else None)
        pairs.append(flows)
    ones = [p["one_engine"] for p in pairs]
    row = {"flows": n, "pairs": pairs, "one_engine_tasks": tasks,
           "finished": min(p["finished"] for p in pairs),
           "all_finished": all(p["all_finished"] for p in pairs),
           "failures": sorted({f for p in pairs for f in p["failures"]})}
    for key in ("wall_s", "flows_per_s", "tasks_per_s", "cpu_ms_per_task", "switches_per_task",
                "full_gc", "gc_s", "ratio_vs_one_engine", "cpu_ratio_vs_one_engine",
                "workers_cpu_ms_per_task"):
        row[key] = median(pairs, key)
    for key in ("tasks_per_s", "cpu_ms_per_task", "switches_per_task", "full_gc", "gc_s",
                "workers_cpu_ms_per_task"):
        row["one_engine_" + key] = median(ones, key)
    for key in ("peak_sockets", "peak_library_threads", "peak_rss_mb"):
        row[key] = max(p[key] for p in pairs)
    return row


out = {"baseline_rss_mb": rss_mb()}
one_engine(3)  # warm: the client and the workers known
lone = []
for _ in range(cfg["lone"]):
    engine = engines.load(three(0), engine="worker-based", **cfg["engine_options"])
    started = time.perf_counter()
    engine.run()
    lone.append(time.perf_counter() - started)
out["lone_flow_ms"] = 1000 * statistics.median(lone)
rows = []
for n in cfg["flows"]:
    row = measure(n)
    rows.append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)
out["rows"] = rows
print(json.dumps(out))
"""


def run_engine_process(broker: ceiling.Broker, exchange: str, tasks_dir: str, flows: list[int],
                       args: argparse.Namespace, worker_pids: list[int]) -> dict[str, Any]:
    """Run the many-flows workloads in one engine process; its measurements, or an error."""
    options = {"exchange": exchange, "topics": [wbe.TOPIC],
               "transition_timeout": TRANSITION_TIMEOUT,
               **wbe._broker_options(broker, "flowengine")}
    config = {"tasks_dir": tasks_dir, "engine_options": options, "flows": flows,
              "lone": args.lone, "one_engine_cap": args.one_engine_cap,
              "timeout": args.run_timeout, "pairs": args.pairs, "worker_pids": worker_pids}
    try:
        proc = subprocess.run([sys.executable, "-c", _ENGINE_CHILD, json.dumps(config)],
                              cwd=tasks_dir, capture_output=True, text=True,
                              timeout=args.run_timeout * (len(flows) * args.pairs + 1) + 120,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": "the engine process timed out"}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:] if proc.stderr else ["failed"]
        return {"error": " | ".join(tail)}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def judge(name: str, result: dict[str, Any], limit: dict[str, Any]) -> None:
    """Add the raw round trip comparison and, on Redis, the targets."""
    trip = (limit.get("sequential") or {}).get("p50_ms")
    if trip and "lone_flow_ms" in result:
        result["raw_round_trip_ms"] = trip
        result["lone_flow_vs_3_round_trips"] = result["lone_flow_ms"] / (3 * trip)
    confirmed = ((limit.get("confirmed") or {}).get("sequential") or {}).get("p50_ms")
    if confirmed and "lone_flow_ms" in result:
        result["confirmed_round_trip_ms"] = confirmed
        result["lone_flow_vs_3_confirmed_round_trips"] = result["lone_flow_ms"] / (3 * confirmed)
    rebuild: dict[str, bool | None] = {
        "lone_flow_within_2x_round_trips": None if "lone_flow_vs_3_round_trips" not in result
        else result["lone_flow_vs_3_round_trips"] <= REBUILD_LONE_X}
    if name == "redis":
        at = [r for r in result.get("rows", []) if r["flows"] == REBUILD_FLOWS]
        pairs = [p.get("ratio_vs_one_engine") for r in at for p in r.get("pairs", [])]
        rebuild["median_ratio_at_least_0_9_at_1000_flows"] = (
            at[0]["ratio_vs_one_engine"] >= REBUILD_RATIO if at else None)
        rebuild["no_pair_below_0_75_at_1000_flows"] = (
            all(p is not None and p >= REBUILD_LOWEST_PAIR for p in pairs) if pairs else None)
    result["rebuild_targets_met"] = rebuild
    if name != "redis" or "rows" not in result:
        return
    rows = result["rows"]
    result["targets_met"] = {
        "all_flows_finish": all(r["all_finished"] for r in rows),
        "task_rate_at_least_0_7_of_one_engine": all(
            r["ratio_vs_one_engine"] >= TARGET_RATIO for r in rows if r["flows"] <= 1000),
        "at_most_16_sockets": all(r["peak_sockets"] <= TARGET_SOCKETS for r in rows),
        "at_most_32_library_threads": all(
            r["peak_library_threads"] <= TARGET_THREADS for r in rows),
        "lone_flow_within_3x_round_trips":
            result.get("lone_flow_vs_3_round_trips", TARGET_LONE_X + 1) <= TARGET_LONE_X,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", nargs="+", choices=ceiling.BROKERS,
                        default=list(ceiling.BROKERS))
    parser.add_argument("--flows", type=int, nargs="+", default=[100, 1000],
                        help="concurrent flows, on every broker")
    parser.add_argument("--redis-flows", type=int, nargs="*", default=[],
                        help="more counts on Redis only (e.g. 10000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8, help="task threads per worker")
    parser.add_argument("--lone", type=int, default=20, help="lone 3-task flows timed")
    parser.add_argument("--one-engine-cap", type=int, default=3000,
                        help="most tasks of the one-engine comparison flow")
    parser.add_argument("--pairs", type=int, default=3,
                        help="alternated (N flows, one engine) pairs per N; medians reported")
    parser.add_argument("--run-timeout", type=float, default=600.0,
                        help="seconds each batch of concurrent flows may take")
    parser.add_argument("--ceiling-sequential", type=int, default=200)
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1, got {args.pairs}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flowengine-many-flows-") as tmp:
        Path(tmp, f"{wbe.TASKS_MODULE}.py").write_text(wbe._TASKS.format(lib="flowengine"))
        for name in args.brokers:
            broker = ceiling.make_broker(name, os.path.join(tmp, "fs"))
            limit = ceiling.measure(broker, args.ceiling_sequential, 10)
            if name == "rabbitmq":  # for information: see the module's docstring
                limit["confirmed"] = ceiling.measure(broker, args.ceiling_sequential, 10,
                                                     confirm_publish=True)
            exchange = f"many-{uuid.uuid4().hex[:8]}"
            flows = args.flows + (args.redis_flows if name == "redis" else [])
            leftovers: list[str] = []
            try:
                with wbe.flowengine_workers(broker, exchange, args.workers, args.threads,
                                            tmp) as (leftovers, pids):
                    result = run_engine_process(broker, exchange, tmp, flows, args, pids)
            except Exception as err:  # an unreachable broker is a result, not a crash
                result = {"error": f"{type(err).__name__}: {err}"}
            finally:
                ceiling.purge(broker, exchange, [f"{exchange}_{wbe.TOPIC}", *leftovers])
            judge(name, result, limit)
            results[name] = {"ceiling_sequential": limit.get("sequential"), **result}
            print(json.dumps({name: results[name]}), file=sys.stderr)
    print(json.dumps({
        "benchmark": "many_flows", "python": platform.python_version(),
        "cpus": os.cpu_count(), "workers": args.workers, "threads_per_worker": args.threads,
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
