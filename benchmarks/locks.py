"""Lock benchmark: how long taking, releasing and handing over a lock takes, per backend.

For each backend (``--backends``: ``redis``, ``zookeeper``, ``etcd``, comma-separated; all three
by default), on a namespace of its own removed at the end, with two coordinators (two
connections, as two processes would have):

* ``acquire``: an uncontended :meth:`~flowengine.coordination.Coordinator.acquire` of a fresh
  key, ``--samples`` times (median, p95, max in ms): join the queue and find oneself first.
* ``release``: the matching :meth:`~flowengine.coordination.Ticket.release` (leave the queue).
* ``handover``: one coordinator holds the key, the other waits for it; the time from the
  holder's ``release()`` to the waiter holding it (the service's notification, the waiter's
  look), ``--samples`` times.

Prints one JSON document. Example::

    python benchmarks/locks.py --samples 200
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from flowengine import coordination

REDIS_URL = os.environ.get("FLOWENGINE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def summary(samples: list[float]) -> dict[str, Any]:
    """Median, p95 and max of ``samples`` (seconds) in milliseconds."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"samples": len(ordered), "median_ms": round(statistics.median(ordered) * 1000, 3),
            "p95_ms": round(p95 * 1000, 3), "max_ms": round(ordered[-1] * 1000, 3)}


class _Heard:
    """When a waiter's ticket was granted (its future's done callback)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.at = 0.0

    def __call__(self, _future: Any) -> None:
        self.at = time.perf_counter()
        self.event.set()


def measure(conf: str, samples: int) -> dict[str, Any]:
    """The three measurements on the service ``conf`` names."""
    acquired, released, handed = [], [], []
    with coordination.connect(conf, owner="bench-a") as one, \
            coordination.connect(conf, owner="bench-b") as other:
        for index in range(samples):
            key = f"bench:{index}"
            started = time.perf_counter()
            ticket = one.acquire(key)
            took = time.perf_counter()
            ticket.release()
            acquired.append(took - started)
            released.append(time.perf_counter() - took)
        for index in range(samples):
            key = f"handover:{index}"
            holder = one.acquire(key)
            waiter = other.request(key)
            heard = _Heard()
            waiter.future.add_done_callback(heard)
            started = time.perf_counter()
            holder.release()
            if not heard.event.wait(30):
                raise RuntimeError(f"the waiter never got {key!r} on {conf}")
            handed.append(heard.at - started)
            waiter.release()
    return {"acquire": summary(acquired), "release": summary(released),
            "handover": summary(handed)}


@contextlib.contextmanager
def place(backend: str, args: argparse.Namespace, run: str) -> Iterator[str]:
    """A conf on ``backend`` under a namespace of this run's; wiped on leaving."""
    wipe: Callable[[], None]
    if backend == "redis":
        import redis

        conf = f"{args.redis}?namespace={run}"

        def wipe() -> None:
            client = redis.Redis.from_url(args.redis)
            keys = list(client.scan_iter(match=f"{run}:*"))
            if keys:
                client.delete(*keys)
            client.close()
    elif backend == "zookeeper":
        from kazoo.client import KazooClient

        conf = f"zookeeper://{args.zookeeper}/{run}/jobs"

        def wipe() -> None:
            client = KazooClient(hosts=args.zookeeper)
            client.start(timeout=15)
            with contextlib.suppress(Exception):
                client.delete(f"/{run}", recursive=True)
            client.stop()
            client.close()
    elif backend == "etcd":
        import etcd3gw

        host, _, port = args.etcd.rpartition(":")
        conf = f"etcd://{args.etcd}/{run}"

        def wipe() -> None:
            etcd3gw.Etcd3Client(host=host, port=int(port), timeout=10).delete_prefix(
                f"/taskflow/.coordination/{run}/")
    else:
        raise SystemExit(f"unknown backend {backend!r}: redis, zookeeper or etcd")
    try:
        yield conf
    finally:
        wipe()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="redis,zookeeper,etcd")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--etcd", default="127.0.0.1:2379")
    args = parser.parse_args()
    run = f"flowengine-bench-locks-{uuid.uuid4().hex[:8]}"
    results = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        with place(backend, args, run) as conf:
            results[backend] = measure(conf, args.samples)
    print(json.dumps({"benchmark": "locks", "run": run, "samples": args.samples,
                      "python": platform.python_version(), "cpus": os.cpu_count(),
                      "load": os.getloadavg()[0], "results": results}, indent=2))


if __name__ == "__main__":
    main()
