"""Celery on the same workloads as ``wbe.py``: the runner a team would pick instead, measured.

Two workloads, as ``wbe.py`` runs them on flowengine: a group of ``--unordered`` independent
no-op tasks (throughput: ``tasks_per_s``) and a chain of ``--linear`` no-op tasks (each step
starts when the previous one ended: ``per_task_ms``). One Celery worker process with
``--concurrency`` threads (4, as one flowengine worker process with its default 4 task
threads), on each chosen broker (``redis``, ``rabbitmq``: the servers ``.ci/services.sh``
runs), with the results in Redis (database 15), in two configurations:

``defaults``
    Celery's own defaults: a request is acknowledged when a worker takes it (before it runs),
    four requests prefetched per thread, no publisher confirms.
``at-least-once``
    What flowengine promises: ``task_acks_late`` (acknowledged after it ran),
    ``task_reject_on_worker_lost``, ``worker_prefetch_multiplier=1``, and on RabbitMQ
    publisher confirms (``confirm_publish``).

Each row also reports the CPU the Celery worker, the broker server and this (client) process
spent per task on Linux (``cpu_ms_per_task``, see ``cpu_usage.py``). ``wbe.py --celery`` runs
this in the same run as flowengine's rows and reports the ratios; alone, it prints one JSON
document::

    python benchmarks/celery_peer.py --brokers redis rabbitmq --unordered 1000 --linear 200
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_usage as cpu  # noqa: E402

#: Broker URLs of the local test servers.
BROKER_URLS = {"redis": "redis://127.0.0.1:6379/14",
               "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//"}
#: Where results go (as in the measurement issue 33 quotes: Celery's results in Redis).
RESULT_URL = "redis://127.0.0.1:6379/15"
CONFIGS = ("defaults", "at-least-once")
#: Seconds a worker gets to answer its first task.
READY_TIMEOUT = 60.0
_ENV_KEYS = ("PEER_BROKER", "PEER_RESULTS", "PEER_CONF")

_APP = '''\
"""A Celery app for benchmarks/celery_peer.py (generated; configured from the environment)."""
import json
import os

from celery import Celery

app = Celery("celery_peer", broker=os.environ["PEER_BROKER"], backend=os.environ["PEER_RESULTS"])
app.conf.update(json.loads(os.environ["PEER_CONF"]))


@app.task(name="peer.noop")
def noop():
    return None
'''


def settings(config: str, broker: str, queue: str) -> dict[str, Any]:
    """The Celery settings of ``config`` on ``broker``, with every task routed to ``queue``."""
    conf: dict[str, Any] = {
        "task_default_queue": queue,
        "task_serializer": "json", "result_serializer": "json", "accept_content": ["json"],
        "worker_hijack_root_logger": False, "broker_connection_retry_on_startup": True,
    }
    if config == "at-least-once":
        conf.update(task_acks_late=True, task_reject_on_worker_lost=True,
                    worker_prefetch_multiplier=1)
        if broker == "rabbitmq":
            conf["broker_transport_options"] = {"confirm_publish": True}
    elif config != "defaults":
        raise ValueError(f"unknown configuration {config!r}: one of {', '.join(CONFIGS)}")
    return conf


@contextlib.contextmanager
def celery_app(broker: str, config: str,
               folder: Path) -> Iterator[tuple[ModuleType, dict[str, str]]]:
    """The app's module (generated in ``folder`` and imported) and the environment its worker
    needs; the app is closed and the environment restored afterwards."""
    queue = f"celery-peer-{uuid.uuid4().hex[:8]}"
    (folder / "celery_peer_app.py").write_text(_APP)
    env = {**os.environ, "PEER_BROKER": BROKER_URLS[broker], "PEER_RESULTS": RESULT_URL,
           "PEER_CONF": json.dumps(settings(config, broker, queue)),
           "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    saved = {key: os.environ.get(key) for key in _ENV_KEYS}
    os.environ.update({key: env[key] for key in _ENV_KEYS})
    sys.path.insert(0, str(folder))
    sys.modules.pop("celery_peer_app", None)
    try:
        import celery_peer_app  # type: ignore[import-not-found]

        try:
            yield celery_peer_app, env
        finally:
            celery_peer_app.app.close()
    finally:
        sys.path.remove(str(folder))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def worker(env: dict[str, str], folder: Path,
           concurrency: int) -> Iterator[subprocess.Popen[bytes]]:
    """One ``celery worker`` process with ``concurrency`` threads, stopped afterwards."""
    argv = [sys.executable, "-m", "celery", "-A", "celery_peer_app", "worker", "--pool",
            "threads", "--concurrency", str(concurrency), "--loglevel", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat"]
    with open(folder / "worker.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, cwd=folder, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _timed(run: Callable[[], Any], groups: dict[str, list[int]],
           tasks: int) -> tuple[float, dict[str, float]]:
    before = cpu.snapshot(groups)
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    return elapsed, cpu.per_unit_ms(before, cpu.snapshot(groups), tasks)


def measure(broker: str, config: str, unordered: int, linear: int, concurrency: int = 4,
            timeout: float = 600.0) -> dict[str, Any]:
    """One row: ``broker`` x ``config``, both workloads on one fresh worker."""
    from celery import chain, group

    with tempfile.TemporaryDirectory(prefix="celery-peer-") as tmp:
        folder = Path(tmp)
        with celery_app(broker, config, folder) as (module, env), \
                worker(env, folder, concurrency) as proc:
            noop = module.noop
            noop.delay().get(timeout=READY_TIMEOUT)  # the worker is up and consuming
            groups = cpu.with_broker({"worker": [proc.pid], "client": [os.getpid()]}, broker)
            row: dict[str, Any] = {"broker": broker, "config": config,
                                   "concurrency": concurrency}
            if unordered:
                elapsed, used = _timed(
                    lambda: group(noop.s() for _ in range(unordered)).apply_async().get(
                        timeout=timeout), groups, unordered)
                row["unordered"] = {"tasks": unordered, "run_s": round(elapsed, 3),
                                    "tasks_per_s": round(unordered / elapsed, 1),
                                    "cpu_ms_per_task": used}
            if linear:
                elapsed, used = _timed(
                    lambda: chain(*(noop.si() for _ in range(linear))).apply_async().get(
                        timeout=timeout), groups, linear)
                row["linear"] = {"tasks": linear, "run_s": round(elapsed, 3),
                                 "per_task_ms": round(elapsed * 1000 / linear, 3),
                                 "cpu_ms_per_task": used}
            return row


def faster(rows: list[dict[str, Any]], broker: str) -> dict[str, float | None]:
    """The faster Celery configuration's figures on ``broker``: the highest group throughput
    and the lowest chain step (each may come from another configuration)."""
    mine = [row for row in rows if row["broker"] == broker]
    rates = [row["unordered"]["tasks_per_s"] for row in mine if "unordered" in row]
    steps = [row["linear"]["per_task_ms"] for row in mine if "linear" in row]
    return {"tasks_per_s": max(rates) if rates else None,
            "per_task_ms": min(steps) if steps else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", nargs="+", default=["redis", "rabbitmq"],
                        choices=sorted(BROKER_URLS))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--unordered", type=int, default=1000, help="tasks in the group")
    parser.add_argument("--linear", type=int, default=200, help="tasks in the chain")
    parser.add_argument("--concurrency", type=int, default=4, help="worker threads")
    args = parser.parse_args()
    import celery

    rows = [measure(broker, config, args.unordered, args.linear, args.concurrency)
            for broker in args.brokers for config in args.configs]
    print(json.dumps({"celery": celery.__version__, "rows": rows,
                      "faster": {b: faster(rows, b) for b in args.brokers}}, indent=2))


if __name__ == "__main__":
    main()
