"""Worker-based engine benchmark: no-op flows on real worker processes, against the kombu ceiling.

Workloads: an unordered flow of ``--unordered`` no-op tasks (throughput) and a linear flow of
``--linear`` (per-task latency: one request and its replies at a time). Each runs on every chosen
broker (redis, rabbitmq, beanstalk, fs = flowengine-fs) with each ``--workers`` count of worker
processes (``flowengine worker``, one topic). The raw kombu request/response rate is measured
first on the same broker (``kombu_ceiling.py``), so every result carries its ratio to that
ceiling. On
RabbitMQ the ceiling is measured a second time with publisher confirms (``ceiling.rabbitmq.
confirmed``): flowengine confirms every outcome, the raw ceiling confirms nothing, so the ratios
to that one (``*_vs_confirmed_*``) are given for information; the targets use the raw ceiling.

The same workloads also run on TaskFlow's worker-based engine, for the ratio against TaskFlow,
whenever TaskFlow is at hand: by default this interpreter, when it can import ``taskflow`` (it
is a test dependency); ``--taskflow PYTHON`` or ``TASKFLOW_PYTHON`` names another interpreter,
``--no-taskflow`` (or ``TASKFLOW_PYTHON=``) leaves TaskFlow out. TaskFlow cannot load
flowengine-fs; its nearest brokerless equivalent is kombu's stock ``filesystem`` transport, which
TaskFlow cannot use reliably: that transport orders messages written in the same millisecond at
random, so a task's SUCCESS reply can overtake its RUNNING one, and TaskFlow's engine then fails
the request's PENDING -> SUCCESS transition and, logging it, calls ``logger.warnng`` (a typo in
TaskFlow 6.x ``protocol.py``), whose AttributeError kills its reply consumer: the run hangs.
So the TaskFlow ``fs`` rows say so and are skipped unless ``--taskflow-fs`` asks to try anyway.

Reported per run: ``run_s`` (``engine.run()``, including finding the workers),
``tasks_per_s`` (tasks / run_s), ``steady_tasks_per_s`` (between the first and the last task's
SUCCESS; when completions arrive in one burst it says so, not how fast the engine is),
``first_task_ms``, ``after_last_task_ms`` (from the last SUCCESS until ``run()``
returns: the executor's shutdown) and, for the linear flow, ``per_task_ms`` (median gap between
consecutive SUCCESS notifications). Compile and storage preparation happen before the clock starts.
On Linux each workload also reports ``cpu_ms_per_task``: the CPU time the engine, the worker
processes and the broker server (none for ``fs``) spent during ``run()``, per task, and their
total; against the machine's cores it bounds the rate any run could reach (``cpu_usage.py``).

``--celery`` also runs Celery 5 on the same workloads, brokers (Redis and RabbitMQ) and machine in
the same run (``celery_peer.py``: one Celery worker with ``--threads`` threads, its results in
Redis, with Celery's defaults and configured at-least-once), and gives each one-worker
flowengine row its ratios to the faster Celery configuration (``unordered_vs_celery``: tasks/s
over Celery's group rate; ``linear_step_vs_celery``: Celery's chain step over flowengine's
linear step; both at least 2 is the target) and, on RabbitMQ, to the confirmed raw ceiling (at
least 0.5).

Every engine and worker runs in its own process, each engine run is bounded by ``--run-timeout``,
and queues and exchanges the runs leave on a broker are deleted afterwards. Prints one JSON
document. Example::

    python benchmarks/wbe.py --workers 1 2 --taskflow /tmp/probe/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import celery_peer  # noqa: E402
import cpu_usage as cpu  # noqa: E402
import kombu_ceiling as ceiling  # noqa: E402

from flowengine.worker_based.executor import WorkerTaskExecutor  # noqa: E402

TOPIC = "bench"
#: Why the TaskFlow rows on ``fs`` are skipped by default (the module docstring tells more).
TASKFLOW_FS_UNRELIABLE = (
    "TaskFlow cannot load flowengine-fs, and cannot use kombu's stock filesystem transport "
    "reliably: replies written in the same millisecond arrive in random order, a SUCCESS "
    "before its RUNNING makes TaskFlow's engine call logger.warnng (a typo in TaskFlow 6.x), "
    "which kills its reply consumer and hangs the run; --taskflow-fs tries anyway"
)
TASKS_MODULE = "wbe_bench_tasks"
_TASKS = """\
from {lib} import task


class Noop(task.Task):
    def execute(self):
        return None
"""

# Runs in the engine's own process, with the interpreter of the library under test.
_ENGINE_CHILD = r"""
import json, os, statistics, sys, time
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["tasks_dir"])
sys.path.insert(0, cfg["bench_dir"])
import cpu_usage
if cfg["lib"] == "taskflow":
    if str(cfg["engine_options"].get("url") or "").startswith("beanstalk:"):  # as kombu has none
        import flowengine.worker_based.broker.transport_beanstalk
    from taskflow import engines
    from taskflow.patterns import linear_flow, unordered_flow
else:
    from flowengine import engines
    from flowengine.flows import linear_flow, unordered_flow
import wbe_bench_tasks as tasks

out = {}
for shape, size in cfg["workloads"]:
    pattern = linear_flow if shape == "linear" else unordered_flow
    flow = pattern.Flow(shape).add(*[tasks.Noop("t%d" % i) for i in range(size)])
    engine = engines.load(flow, engine="worker-based", **cfg["engine_options"])
    done = []

    def on_success(state, details):
        done.append(time.perf_counter())

    engine.atom_notifier.register("SUCCESS", on_success)
    engine.compile()
    engine.prepare()
    watched = {"engine": [os.getpid()], **cfg["watch"]}
    cpu_before = cpu_usage.snapshot(watched)
    started = time.perf_counter()
    engine.run()
    run_s = time.perf_counter() - started
    cpu = cpu_usage.per_unit_ms(cpu_before, cpu_usage.snapshot(watched), size)
    gaps = [b - a for a, b in zip(done, done[1:])]
    row = {
        "tasks": size,
        "run_s": run_s,
        "tasks_per_s": size / run_s,
        "first_task_ms": 1000 * (done[0] - started),
        "after_last_task_ms": 1000 * (started + run_s - done[-1]),
        "steady_tasks_per_s": (len(done) - 1) / (done[-1] - done[0]) if len(done) > 1 else None,
        "flow_uuid": engine.storage.flow_uuid,
    }
    if cpu:
        row["cpu_ms_per_task"] = cpu
    if shape == "linear" and gaps:
        row["per_task_ms"] = 1000 * statistics.median(gaps)
        row["per_task_ms_p95"] = 1000 * sorted(gaps)[int(0.95 * (len(gaps) - 1))]
    out[shape] = row
print(json.dumps(out))
"""

# A TaskFlow worker that takes transport options (its own CLI does not) and says when it is up.
_TASKFLOW_WORKER = r"""
import json, signal, sys, threading
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["tasks_dir"])
if str(cfg.get("url") or "").startswith("beanstalk:"):  # kombu has none: flowengine's
    import flowengine.worker_based.broker.transport_beanstalk
from taskflow.engines.worker_based import worker
w = worker.Worker(cfg["exchange"], cfg["topic"], [cfg["tasks"]], url=cfg.get("url"),
                  transport=cfg.get("transport"), transport_options=cfg.get("transport_options"))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
threading.Thread(target=w.run, kwargs={"display_banner": False}, daemon=True).start()
w.wait()
print("ready", flush=True)
stop.wait()
w.stop()
"""


def _broker_options(broker: ceiling.Broker, lib: str) -> dict[str, Any]:
    """The url/transport/transport_options an engine or worker of ``lib`` uses on ``broker``."""
    if broker.url:
        return {"url": broker.url}
    if lib == "taskflow":  # kombu's stock filesystem transport: TaskFlow cannot load ours
        folder = str(Path(broker.transport_options["data_folder"]) / "kombu-filesystem")
        os.makedirs(folder, exist_ok=True)
        options = {"data_folder_in": folder, "data_folder_out": folder,
                   "polling_interval": broker.transport_options["polling_interval"]}  # fmt: skip
        return {"transport": "filesystem", "transport_options": options}
    return {"transport": broker.transport, "transport_options": dict(broker.transport_options)}


def _terminate(procs: list[subprocess.Popen[Any]], timeout: float = 15.0) -> list[int | None]:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes.append(None)
    return codes


@contextlib.contextmanager
def flowengine_workers(
    broker: ceiling.Broker, exchange: str, count: int, threads: int, tasks_dir: str
) -> Iterator[tuple[list[str], list[int]]]:
    """Start ``count`` ``flowengine worker`` processes; yield once all have announced themselves.

    Yields the names of the queues the readiness check left behind, and the workers' pids.
    """
    options = _broker_options(broker, "flowengine")
    listener_id = uuid.uuid4().hex
    listener = WorkerTaskExecutor(listener_id, exchange, [], **options)
    listener.start()
    command = [
        sys.executable, "-m", "flowengine.cli.main", "worker", "--exchange", exchange,
        "--topic", TOPIC, "--task", TASKS_MODULE, "--threads", str(threads),
        "--log-level", "WARNING", "--grace", "10",
    ]  # fmt: skip
    if "url" in options:
        command += ["--url", options["url"]]
    else:
        command += ["--transport", options["transport"]]
        for key, value in options["transport_options"].items():
            text = value if isinstance(value, str) else json.dumps(value)
            command += ["--transport-option", f"{key}={text}"]
    procs: list[subprocess.Popen[bytes]] = []
    logs = [Path(tasks_dir, f"worker-{i}.log") for i in range(count)]
    try:
        for log in logs:
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(
                    command, cwd=tasks_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=out
                ))  # fmt: skip
        deadline = time.monotonic() + 30
        while listener.wait_for_workers(count, timeout=0.1):
            dead = [log for log, proc in zip(logs, procs) if proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = dead[0].read_text(errors="replace")[-500:] if dead else "timed out"
                raise RuntimeError(f"flowengine workers did not come up: {why}")
        listener.stop()
        yield [f"{exchange}_{listener_id}"], [proc.pid for proc in procs]
    finally:
        listener.stop()
        codes = _terminate(procs)
        if any(code != 0 for code in codes):
            print(f"warning: flowengine worker exit codes {codes}", file=sys.stderr)


@contextlib.contextmanager
def taskflow_workers(
    python: str, broker: ceiling.Broker, exchange: str, count: int, tasks_dir: str
) -> Iterator[tuple[list[str], list[int]]]:
    """Start ``count`` TaskFlow workers with ``python``; yield (no leftover queues, their pids)
    once each printed ``ready``."""
    config = {"exchange": exchange, "topic": TOPIC, "tasks": TASKS_MODULE,
              "tasks_dir": tasks_dir, **_broker_options(broker, "taskflow")}  # fmt: skip
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen(
                [python, "-c", _TASKFLOW_WORKER, json.dumps(config)], cwd=tasks_dir,
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            ))  # fmt: skip
        for proc in procs:
            ceiling._wait_for_line(proc, "ready", timeout=30.0)
        yield [], [proc.pid for proc in procs]
    finally:
        _terminate(procs)


def run_engine(
    python: str, lib: str, broker: ceiling.Broker, exchange: str, workloads: list[tuple[str, int]],
    tasks_dir: str, timeout: float, watch: dict[str, list[int]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the workloads in one engine process of ``lib``; its measurements, or an error.

    ``watch`` names the other processes (by group: ``workers``, ``broker``) whose CPU time each
    workload's ``cpu_ms_per_task`` accounts, beside the engine's.
    """
    options = {"exchange": exchange, "topics": [TOPIC], **_broker_options(broker, lib)}
    config = {"lib": lib, "tasks_dir": tasks_dir, "workloads": workloads,
              "engine_options": options, "watch": watch or {},
              "bench_dir": os.path.dirname(os.path.abspath(__file__))}  # fmt: skip
    try:
        proc = subprocess.run(
            [python, "-c", _ENGINE_CHILD, json.dumps(config)], cwd=tasks_dir,
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:] if proc.stderr else ["failed"]
        return {"error": " | ".join(tail)}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if (
        isinstance(numerator, (int, float))
        and isinstance(denominator, (int, float))
        and denominator
    ):
        return numerator / denominator
    return None


def compare(row: dict[str, Any], limit: dict[str, Any], taskflow: dict[str, Any] | None) -> None:
    """Add the ratios to the ceiling (and to TaskFlow) and whether the targets are met."""
    unordered, linear = row.get("unordered", {}), row.get("linear", {})
    pipelined = limit.get("pipelined", {}).get("replies_per_s")
    round_trip = limit.get("sequential", {}).get("p50_ms")
    ratios: dict[str, Any] = {
        "unordered_vs_pipelined_ceiling": _ratio(unordered.get("tasks_per_s"), pipelined),
        "linear_per_task_vs_round_trip": _ratio(linear.get("per_task_ms"), round_trip),
    }
    # For information: the CPU a task costs (engine, workers, broker) against the CPU one raw
    # round trip costs (client, responder, broker), both while many are in flight.
    ratios["unordered_cpu_per_task_vs_round_trip"] = _ratio(
        unordered.get("cpu_ms_per_task", {}).get("total"),
        limit.get("pipelined", {}).get("cpu_ms_per_round_trip", {}).get("total"))
    confirmed = limit.get("confirmed")
    if confirmed:  # for information: the targets are against the raw ceiling
        ratios["unordered_vs_confirmed_pipelined_ceiling"] = _ratio(
            unordered.get("tasks_per_s"), confirmed.get("pipelined", {}).get("replies_per_s"))
        ratios["linear_per_task_vs_confirmed_round_trip"] = _ratio(
            linear.get("per_task_ms"), confirmed.get("sequential", {}).get("p50_ms"))
    if taskflow is not None:
        tf_unordered, tf_linear = taskflow.get("unordered", {}), taskflow.get("linear", {})
        ratios["unordered_vs_taskflow"] = _ratio(
            unordered.get("tasks_per_s"), tf_unordered.get("tasks_per_s")
        )
        ratios["linear_run_vs_taskflow"] = _ratio(tf_linear.get("run_s"), linear.get("run_s"))
        ratios["linear_per_task_vs_taskflow"] = _ratio(
            tf_linear.get("per_task_ms"), linear.get("per_task_ms")
        )
    row["ratios"] = ratios
    throughput, latency = (
        ratios["unordered_vs_pipelined_ceiling"],
        ratios["linear_per_task_vs_round_trip"],
    )
    targets = {
        "throughput_at_least_half_ceiling": None if throughput is None else throughput >= 0.5,
        "linear_latency_within_3x_round_trip": None if latency is None else latency <= 3.0,
    }
    if taskflow is not None:
        vs = ratios.get("unordered_vs_taskflow")
        targets["at_least_10x_taskflow"] = None if vs is None else vs >= 10.0
    row["targets_met"] = targets


def compare_celery(row: dict[str, Any], celery: dict[str, float | None],
                   limit: dict[str, Any]) -> None:
    """Add the ratios to the faster Celery configuration (and, with confirms, to the
    confirmed ceiling) and whether issue 33's targets are met."""
    unordered, linear = row.get("unordered", {}), row.get("linear", {})
    ratios = row.setdefault("ratios", {})
    ratios["unordered_vs_celery"] = _ratio(unordered.get("tasks_per_s"), celery["tasks_per_s"])
    ratios["linear_step_vs_celery"] = _ratio(celery["per_task_ms"], linear.get("per_task_ms"))
    targets = row.setdefault("targets_met", {})
    for key, ratio_key in (("unordered_at_least_2x_celery", "unordered_vs_celery"),
                           ("linear_step_at_least_2x_faster_than_celery",
                            "linear_step_vs_celery")):
        ratio = ratios[ratio_key]
        targets[key] = None if ratio is None else ratio >= 2.0
    confirmed = ratios.get("unordered_vs_confirmed_pipelined_ceiling")
    if "confirmed" in limit:
        targets["unordered_at_least_half_confirmed_ceiling"] = (
            None if confirmed is None else confirmed >= 0.5)


def run_config(
    args: argparse.Namespace, broker: ceiling.Broker, lib: str, python: str, count: int, tmp: str
) -> dict[str, Any]:
    """Start ``count`` workers of ``lib``, run the workloads, clean the broker up."""
    row: dict[str, Any] = {"broker": broker.name, "lib": lib, "workers": count}
    if lib == "taskflow" and broker.name == "fs":
        if not args.taskflow_fs:
            row["skipped"] = TASKFLOW_FS_UNRELIABLE
            return row
        row["transport"] = "kombu filesystem (stock)"
    workloads = [("unordered", args.unordered), ("linear", args.linear)]
    tasks_dir = os.path.join(tmp, f"tasks-{lib}")
    os.makedirs(tasks_dir, exist_ok=True)
    Path(tasks_dir, f"{TASKS_MODULE}.py").write_text(_TASKS.format(lib=lib))
    exchange = f"wbe-bench-{uuid.uuid4().hex[:8]}"
    queues = [f"{exchange}_{TOPIC}"]
    try:
        if lib == "taskflow":
            workers = taskflow_workers(python, broker, exchange, count, tasks_dir)
        else:
            workers = flowengine_workers(broker, exchange, count, args.threads, tasks_dir)
        with workers as (leftovers, pids):
            queues += leftovers
            watch = cpu.with_broker({"workers": pids}, broker.name)
            row.update(run_engine(python, lib, broker, exchange, workloads, tasks_dir,
                                  args.run_timeout, watch))  # fmt: skip
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {err}"
    finally:
        queues += [
            f"{exchange}_{row[shape]['flow_uuid']}" for shape, _ in workloads if shape in row
        ]
        ceiling.purge(broker, exchange, queues)
    return row


def default_taskflow() -> str | None:
    """``TASKFLOW_PYTHON`` if set (empty: none), else this interpreter if it has TaskFlow."""
    named = os.environ.get("TASKFLOW_PYTHON")
    if named is not None:
        return named or None
    return sys.executable if importlib.util.find_spec("taskflow") is not None else None


def taskflow_version(python: str) -> str:
    """The TaskFlow version ``python`` imports.

    Raises:
        SystemExit: ``python`` cannot run or cannot import taskflow (named in the message).
    """
    probe = "import importlib.metadata as m; print(m.version('taskflow'))"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                               timeout=60, check=False)
    except OSError as err:
        raise SystemExit(f"--taskflow {python}: cannot run it: {err}") from err
    if found.returncode != 0:
        raise SystemExit(f"--taskflow {python}: cannot import taskflow: "
                         f"{found.stderr.strip().splitlines()[-1:]}")
    return found.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--brokers", nargs="+", choices=ceiling.BROKERS, default=list(ceiling.BROKERS)
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--unordered", type=int, default=1000, help="tasks in the unordered flow")
    parser.add_argument("--linear", type=int, default=200, help="tasks in the linear flow")
    parser.add_argument(
        "--threads", type=int, default=10, help="task threads per flowengine worker"
    )
    parser.add_argument(
        "--taskflow",
        metavar="PYTHON",
        default=default_taskflow(),
        help="an interpreter with taskflow installed, for the comparison (default: "
        "TASKFLOW_PYTHON, else this one if it can import taskflow)",
    )
    parser.add_argument(
        "--no-taskflow", dest="taskflow", action="store_const", const=None,
        help="leave the TaskFlow comparison out",
    )  # fmt: skip
    parser.add_argument(
        "--taskflow-fs",
        action="store_true",
        help="also try TaskFlow on kombu's stock filesystem transport for the fs rows",
    )
    parser.add_argument(
        "--run-timeout", type=float, default=240.0, help="seconds each engine process may take"
    )
    parser.add_argument(
        "--celery", action="store_true",
        help="also run Celery on the same workloads (redis and rabbitmq rows; celery_peer.py)")
    parser.add_argument("--ceiling-sequential", type=int, default=500)
    parser.add_argument("--ceiling-pipelined", type=int, default=5000)
    args = parser.parse_args()  # fmt: skip
    libs = [("flowengine", sys.executable)]
    taskflow_info: dict[str, Any] = {"compared": False}
    if args.taskflow:
        # The engines and workers run with cwd in a temporary folder.
        python = shutil.which(args.taskflow) or args.taskflow
        python = os.path.abspath(python)
        libs.append(("taskflow", python))
        taskflow_info = {"compared": True, "python": python, "version": taskflow_version(python),
                         "fs": "tried on kombu's stock filesystem transport" if args.taskflow_fs
                         else "skipped: see the fs rows"}  # fmt: skip
    results: list[dict[str, Any]] = []
    ceilings: dict[str, Any] = {}
    celery_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="flowengine-wbe-bench-") as tmp:
        for name in args.brokers:
            broker = ceiling.make_broker(name, os.path.join(tmp, "fs"))
            limit = ceiling.measure(broker, args.ceiling_sequential, args.ceiling_pipelined)
            if name == "rabbitmq":
                # flowengine confirms outcomes (a request is acknowledged only once its outcome
                # is safe), which the raw ceiling does not: this one does, for comparison.
                limit["confirmed"] = ceiling.measure(
                    broker, args.ceiling_sequential, args.ceiling_pipelined,
                    confirm_publish=True)
            ceilings[name] = limit
            print(json.dumps(limit), file=sys.stderr)
            peer: dict[str, float | None] | None = None
            if args.celery and name in celery_peer.BROKER_URLS:
                for config in celery_peer.CONFIGS:
                    celery_rows.append(celery_peer.measure(name, config, args.unordered,
                                                           args.linear, args.threads))
                    print(json.dumps(celery_rows[-1]), file=sys.stderr)
                peer = celery_peer.faster(celery_rows, name)
            for count in args.workers:
                by_lib = {lib: run_config(args, broker, lib, python, count, tmp)
                          for lib, python in libs}  # fmt: skip
                for row in by_lib.values():
                    print(json.dumps(row), file=sys.stderr)
                taskflow = by_lib.get("taskflow")
                if taskflow is not None and "skipped" in taskflow:
                    taskflow = None
                compare(by_lib["flowengine"], limit, taskflow)
                if peer is not None and count == 1:
                    compare_celery(by_lib["flowengine"], peer, limit)
                results.extend(by_lib.values())
    print(json.dumps({
        "benchmark": "wbe",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "sizes": {"unordered": args.unordered, "linear": args.linear},
        "flowengine_threads_per_worker": args.threads,
        "taskflow": taskflow_info,
        "celery": {"compared": bool(celery_rows), "rows": celery_rows},
        "ceiling": ceilings,
        "results": results,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
