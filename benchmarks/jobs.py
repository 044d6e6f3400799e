"""Jobboard and conductor benchmark: throughput, post-to-start latency, failover time.

For each backend (``--backends``: ``redis``, ``zookeeper``, ``etcd``, comma-separated; Redis by
default), every measurement on a board of its own below one root per run, removed at the end
(see :class:`Places`):

* ``throughput``: ``--jobs`` one-task jobs are posted, then 1, 2 and 4 nonblocking conductors
  (threads of this process, each with its own board connection, sharing an in-memory
  persistence backend) run them; jobs per second from the first conductor's start to the last
  job consumed.
* ``latency``: an idle blocking conductor; the time from ``post()`` to the conductor's
  ``running_start`` event, ``--samples`` times (median, p95, max). The project's target: under
  50 ms on an idle conductor.
* ``failover``: two ``flowengine conductor`` processes (claims of ``--claim-ttl`` s); the one
  running a job is killed with SIGKILL; the time from the kill to the job being consumed by
  the other (the target: claim_ttl + 2 s at most).

With TaskFlow installed (``--taskflow``, the default when it imports), the same throughput and
latency are measured with TaskFlow's Redis board and conductors in the same run, and the
ratios reported. Prints one JSON document. Example::

    python benchmarks/jobs.py --jobs 200 --samples 20
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flowengine import task
from flowengine.flows import linear_flow

REDIS_URL = os.environ.get("FLOWENGINE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
HERE = Path(__file__).resolve().parent


class Noop(task.Task):
    def execute(self) -> None:
        return None


class Gated(task.Task):
    """Waits for the file ``gate`` (the failover measurement kills its conductor meanwhile)."""

    def execute(self, gate: str) -> None:
        Path(f"{gate}.waiting").touch()
        while not Path(gate).exists():
            time.sleep(0.01)


def one_step() -> linear_flow.Flow:
    return linear_flow.Flow("bench").add(Noop("noop"))


def gated() -> linear_flow.Flow:
    return linear_flow.Flow("gated").add(Gated("gated"), Noop("after"))


def taskflow_one_step() -> Any:
    from taskflow import task as tf_task
    from taskflow.patterns import linear_flow as tf_linear

    class TfNoop(tf_task.Task):
        def execute(self) -> None:
            return None

    return tf_linear.Flow("bench").add(TfNoop("noop"))


# ---- the two libraries behind one interface ----------------------------------------------------


class Lib:
    """Boards, persistence, posting and conductors of one library.

    The two libraries share their API under different package names, so one class serves both
    through ``root``; only posting a flow differs (flowengine has a helper for it).
    """

    name = "flowengine"
    root = "flowengine"

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.persistence = self._module("persistence.backends.impl_memory").MemoryBackend({})

    def _module(self, path: str) -> Any:
        return importlib.import_module(f"{self.root}.{path}")

    def board(self) -> Any:
        board = self._module("jobs.backends").fetch("bench", dict(self.conf),
                                                    persistence=self.persistence)
        board.connect()
        return board

    def post(self, board: Any) -> Any:
        from flowengine.jobs.posting import post_flow

        return post_flow(board, self.persistence, f"{__name__}.one_step", name="bench")

    def conductor(self, kind: str, name: str, board: Any, **options: Any) -> Any:
        return self._module("conductors.backends").fetch(kind, name, board,
                                                          persistence=self.persistence, **options)


class TaskFlowLib(Lib):
    name = "taskflow"
    root = "taskflow"

    def post(self, board: Any) -> Any:
        from taskflow import engines
        from taskflow.persistence import models

        book = models.LogBook("bench")
        detail = models.FlowDetail("bench", str(uuid.uuid4()))
        book.add(detail)
        engines.save_factory_details(detail, taskflow_one_step, (), {})
        with contextlib.closing(self.persistence.get_connection()) as conn:
            conn.save_logbook(book)
        return board.post("bench", book=book, details={})


# ---- measurements ------------------------------------------------------------------------------


class Counter:
    def __init__(self) -> None:
        self.count = 0
        self.times: list[float] = []
        self._changed = threading.Condition()

    def __call__(self, event: str, details: dict[str, Any]) -> None:
        with self._changed:
            self.count += 1
            self.times.append(time.perf_counter())
            self._changed.notify_all()

    def wait(self, count: int, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count >= count, timeout)


@contextlib.contextmanager
def running(conductors: list[Any]) -> Iterator[None]:
    threads = [threading.Thread(target=c.run, daemon=True) for c in conductors]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for conductor in conductors:
            conductor.stop()
        for thread in threads:
            thread.join(30)


def throughput(lib: Lib, jobs: int, conductors: int) -> dict[str, Any]:
    poster = lib.board()
    for _ in range(jobs):
        lib.post(poster)
    consumed = Counter()
    made = []
    boards = [lib.board() for _ in range(conductors)]
    for i, board in enumerate(boards):
        conductor = lib.conductor("nonblocking", f"bench-{i}", board, max_simultaneous_jobs=4)
        conductor.notifier.register("job_consumed", consumed)
        made.append(conductor)
    started = time.perf_counter()
    with running(made):
        finished = consumed.wait(jobs, timeout=max(60.0, jobs * 0.5))
    took = (consumed.times[-1] if consumed.times else time.perf_counter()) - started
    for board in [poster, *boards]:
        board.close()
    return {"conductors": conductors, "jobs": jobs, "consumed": consumed.count,
            "complete": finished, "seconds": round(took, 3),
            "jobs_per_s": round(consumed.count / took, 1) if took > 0 else None}


def latency(lib: Lib, samples: int) -> dict[str, Any]:
    poster, board = lib.board(), lib.board()
    conductor = lib.conductor("blocking", "bench-latency", board)
    started, consumed = Counter(), Counter()
    conductor.notifier.register("running_start", started)
    conductor.notifier.register("job_consumed", consumed)
    delays = []
    with running([conductor]):
        time.sleep(0.5)  # let the conductor reach its idle wait before the first post
        for i in range(samples):
            posted_at = time.perf_counter()
            lib.post(poster)
            if not started.wait(i + 1, 30) or not consumed.wait(i + 1, 30):
                break
            delays.append((started.times[i] - posted_at) * 1000)
            time.sleep(0.05)  # idle again
    poster.close()
    board.close()
    if not delays:
        return {"samples": 0}
    ordered = sorted(delays)
    return {"samples": len(delays), "median_ms": round(statistics.median(ordered), 2),
            "p95_ms": round(ordered[max(0, int(len(ordered) * 0.95) - 1)], 2),
            "max_ms": round(ordered[-1], 2), "target_ms": 50,
            "target_met": statistics.median(ordered) < 50}


def failover(conf: dict[str, Any], claim_ttl: float) -> dict[str, Any]:
    """Two conductors, one job: the one running it is killed; how soon the other finishes it."""
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as workdir:
        return _failover_in(Path(workdir), conf, claim_ttl)


def _failover_in(workdir: Path, conf: dict[str, Any], claim_ttl: float) -> dict[str, Any]:
    from flowengine.jobs import backends
    from flowengine.jobs.posting import post_flow
    from flowengine.persistence import backends as p_backends

    gate, db = workdir / "gate", workdir / "flows.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    options = [f"{k}={v}" for k, v in {**conf, "claim_ttl": claim_ttl}.items() if k != "board"]
    argv = [sys.executable, "-m", "flowengine.cli.main", "conductor", "--board", conf["board"],
            "--backend", f"sqlite:///{db}", "--max-jobs", "1", "--log-level", "WARNING"]
    for option in options:
        argv += ["--board-option", option]
    procs = []
    with p_backends.backend(f"sqlite:///{db}") as store, \
            backends.backend("bench", {**conf, "claim_ttl": claim_ttl}) as board:
        try:
            for name in ("a", "b"):
                procs.append(subprocess.Popen([*argv, "--name", name], cwd=HERE, env=env,
                                              stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + 60
            while len(board.iter_entities("conductor")) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            job = post_flow(board, store, "jobs.gated", store={"gate": str(gate)})
            while not Path(f"{gate}.waiting").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            owner = board.find_owner(job)
            victim = next(p for p, n in zip(procs, ("a", "b"), strict=True) if n == owner)
            Path(f"{gate}.waiting").unlink()
            victim.send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            gate.touch()
            done = job.wait(timeout=claim_ttl + 30)
            took = time.perf_counter() - killed
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(10)
    return {"claim_ttl_s": claim_ttl, "completed": done, "seconds_after_kill": round(took, 2),
            "target_s": claim_ttl + 2, "target_met": done and took <= claim_ttl + 2}


# ---- driver ------------------------------------------------------------------------------------


class Places:
    """Unique places on each backend for one run: all under one parent, removed at the end.

    Every measurement gets its own board (``conf()``) below the run's root, so no measurement
    sees another's jobs: Redis keys ``flowengine-bench:<run>:<n>:*``, ZooKeeper paths
    ``/flowengine-bench/<run>/<n>/jobs`` (the board's trash and entities are its siblings), etcd
    board paths ``flowengine-bench/<run>/<n>``.
    """

    PARENT = "flowengine-bench"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = uuid.uuid4().hex[:8]
        self.made = 0

    def conf(self, backend: str) -> dict[str, Any]:
        """The conf of a new, empty board on ``backend``."""
        self.made += 1
        if backend == "redis":
            return {"board": self.args.redis,
                    "namespace": f"{self.PARENT}:{self.run}:{self.made}"}
        if backend == "zookeeper":
            return {"board": "zookeeper", "hosts": self.args.zookeeper,
                    "path": f"/{self.PARENT}/{self.run}/{self.made}/jobs"}
        if backend == "etcd":
            host, port = etcd_address(self.args.etcd)
            return {"board": "etcd", "host": host, "port": port,
                    "path": f"{self.PARENT}/{self.run}/{self.made}"}
        raise SystemExit(f"unknown backend {backend!r} (known: redis, zookeeper, etcd)")

    def remove(self, backend: str) -> None:
        """Delete everything this run stored on ``backend``."""
        if backend == "redis":
            import redis

            client = redis.Redis.from_url(self.args.redis)
            try:
                keys = list(client.scan_iter(match=f"{self.PARENT}:{self.run}:*", count=1000))
                if keys:
                    client.delete(*keys)
            finally:
                client.close()
        elif backend == "zookeeper":
            from kazoo.client import KazooClient

            zk = KazooClient(hosts=self.args.zookeeper)
            zk.start(timeout=15)
            try:
                zk.delete(f"/{self.PARENT}/{self.run}", recursive=True)
                with contextlib.suppress(Exception):  # another run may still use the parent
                    zk.delete(f"/{self.PARENT}")
            finally:
                zk.stop()
                zk.close()
        elif backend == "etcd":
            import etcd3gw

            host, port = etcd_address(self.args.etcd)
            etcd = etcd3gw.Etcd3Client(host=host, port=port, timeout=10)
            for root in ("/taskflow/jobs/", "/taskflow/.trash/", "/taskflow/.entities/"):
                etcd.delete_prefix(f"{root}{self.PARENT}/{self.run}/")


def etcd_address(address: str) -> tuple[str, int]:
    host, _, port = address.partition(":")
    return host, int(port or 2379)


def guarded(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return measure()
    except Exception as err:  # one broken backend must not hide the others' numbers
        return {"error": f"{type(err).__name__}: {err}"}


def measure_backend(name: str, args: argparse.Namespace, places: Places,
                    counts: list[int]) -> dict[str, Any]:
    """Throughput, latency and (unless disabled) failover of flowengine on one backend."""
    row: dict[str, Any] = {}
    row["throughput"] = [guarded(lambda n=n: throughput(Lib(places.conf(name)), args.jobs, n))
                         for n in counts]
    row["latency"] = guarded(lambda: latency(Lib(places.conf(name)), args.samples))
    if not args.no_failover:
        row["failover"] = guarded(lambda: failover(places.conf(name), args.claim_ttl))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="redis", help="comma-separated: redis,zookeeper,etcd")
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--etcd", default="127.0.0.1:2379")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--conductors", default="1,2,4")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--claim-ttl", type=float, default=2.0)
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--no-taskflow", action="store_true")
    args = parser.parse_args()
    counts = [int(c) for c in args.conductors.split(",") if c]
    report: dict[str, Any] = {"benchmark": "jobs", "python": platform.python_version(),
                              "cpus": os.cpu_count(), "results": {}}
    backends = [name for name in args.backends.split(",") if name]
    places = Places(args)
    report["run"] = places.run
    try:
        for name in backends:
            places.conf(name)  # an unknown name stops the run before anything is measured
        for name in backends:
            report["results"][name] = measure_backend(name, args, places, counts)
        if not args.no_taskflow and "redis" in backends:
            report.update(taskflow_comparison(args, places, counts, report["results"]["redis"]))
    finally:
        for name in backends:
            try:
                places.remove(name)
            except Exception as err:  # report it, but keep the numbers measured
                print(f"could not remove this run's data from {name}: {err}", file=sys.stderr)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


def taskflow_comparison(args: argparse.Namespace, places: Places, counts: list[int],
                        ours: dict[str, Any]) -> dict[str, Any]:
    """TaskFlow's throughput and latency on Redis, and their ratios to flowengine's."""
    tf = {"throughput": [guarded(lambda n=n: throughput(TaskFlowLib(places.conf("redis")),
                                                         args.jobs, n)) for n in counts],
          "latency": guarded(lambda: latency(TaskFlowLib(places.conf("redis")), args.samples))}
    ratios: dict[str, Any] = {}
    with contextlib.suppress(KeyError, TypeError, ZeroDivisionError):
        ratios["latency_median_taskflow_over_flowengine"] = round(
            tf["latency"]["median_ms"] / ours["latency"]["median_ms"], 1)
    for mine, theirs in zip(ours["throughput"], tf["throughput"], strict=True):
        with contextlib.suppress(KeyError, TypeError, ZeroDivisionError):
            ratios[f"jobs_per_s_{mine['conductors']}_conductors_flowengine_over_taskflow"] = \
                round(mine["jobs_per_s"] / theirs["jobs_per_s"], 2)
    return {"taskflow_redis": tf, "ratios": ratios}


if __name__ == "__main__":
    main()
