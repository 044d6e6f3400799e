"""Dashboard benchmark: its pages over a SQLite store of 100,000 flows, and its live updates.

1. Stores ``--flows`` flow records (default 100,000, inserted in bulk as the SQL backend stores
   them: one logbook per 1,000 flows, states and update times spread over 30 days), a flow of a
   few atoms and a flow of ``--atoms`` atoms (default 1,000), both run by the serial engine with
   their factory and timings stored.
2. Times, through the ASGI app in this process (no network), the best and median of
   ``--repeat`` requests: the first flows page, a filtered page, a deep page (``--deep-page``,
   default 500: by its number, an OFFSET, and as the pager's "older" link opens it, a keyset
   seek), page 1,000, a small flow's page, and the big flow's page (first request: rebuilding
   and compiling the flow; then warm).
3. Serves the app with uvicorn, follows ``/events`` as a browser does, publishes ``--events``
   events on the ``flowengine-fs`` transport and reports the delay from each event's emission
   to its arrival in the page's stream.

The issue's target: the first flows page of 100,000 stored flows in under 300 ms on SQLite.
Prints one JSON document; progress goes to stderr. Example::

    python benchmarks/dashboard.py --flows 100000 --atoms 1000 --repeat 7
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import platform
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from flowengine import engines, task
from flowengine.dashboard import DashboardData, EventHub, create_app
from flowengine.flows import linear_flow, unordered_flow
from flowengine.persistence import backends, base, models
from flowengine.persistence.backends._sql import tables
from flowengine.persistence.queries import FlowCursor
from flowengine.worker_based.events import EventPublisher, EventReceiver

STATES = ("SUCCESS", "SUCCESS", "SUCCESS", "REVERTED", "FAILURE", "RUNNING", "SUSPENDED")
BOOK_SIZE = 1_000


class Step(task.Task):
    def execute(self) -> int:
        return 1


def big_flow(atoms: int) -> linear_flow.Flow:
    """``atoms`` steps: a first one, the rest side by side in groups of ten, in a line."""
    flow = linear_flow.Flow("big").add(Step("start"))
    for group in range(0, atoms - 1, 10):
        flow.add(unordered_flow.Flow(f"g{group}").add(
            *[Step(f"s{i}") for i in range(group, min(group + 10, atoms - 1))]))
    return flow


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fill(backend: Any, count: int) -> None:
    """Insert ``count`` flow records (and their logbooks) in bulk."""
    t = tables.define(sa.MetaData())
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    rng = random.Random(7)
    with backend.engine.begin() as conn:
        for start in range(0, count, BOOK_SIZE):
            book = str(uuid.uuid4())
            conn.execute(sa.insert(t.logbooks), [{"uuid": book, "name": f"book-{start}",
                                                  "meta": "{}", "created_at": now,
                                                  "updated_at": now}])
            rows = []
            for index in range(start, min(start + BOOK_SIZE, count)):
                when = now - datetime.timedelta(seconds=rng.uniform(0, 30 * 86400))
                rows.append({"uuid": str(uuid.uuid4()), "parent_uuid": book,
                             "name": f"order-{index % 97}", "state": rng.choice(STATES),
                             "meta": "{}", "created_at": when, "updated_at": when})
            conn.execute(sa.insert(t.flowdetails), rows)


def run_stored(backend: base.Backend, factory: Any, args: list[Any]) -> str:
    engine = engines.load_from_factory(factory, factory_args=args, backend=backend,
                                       book=models.LogBook("bench"))
    engine.run()
    return str(engine.storage.flow_uuid)


def timed(call: Callable[[], Any], repeat: int) -> dict[str, float]:
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return {"best_ms": round(min(took) * 1000, 2), "median_ms": round(
        statistics.median(took) * 1000, 2)}


def deep_cursor(backend: Any, page: int, size: int = 50) -> str:
    """The "older" link's cursor that opens ``page`` (the last row of the page before it)."""
    t = tables.define(sa.MetaData())
    with backend.engine.connect() as conn:
        row = conn.execute(sa.select(t.flowdetails.c.updated_at, t.flowdetails.c.uuid)
                           .order_by(t.flowdetails.c.updated_at.desc(),
                                     t.flowdetails.c.uuid.desc())
                           .offset((page - 1) * size - 1).limit(1)).one()
    return FlowCursor(row.updated_at, row.uuid).text()


def pages(client: Any, small: str, big: str, repeat: int, deep: int,
          after: str) -> dict[str, Any]:
    def get(path: str) -> Callable[[], None]:
        def call() -> None:
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code)
        return call

    results: dict[str, Any] = {}
    started = time.perf_counter()
    get(f"/flows/{big}")()
    results["big_flow_page_cold_ms"] = round((time.perf_counter() - started) * 1000, 2)
    for name, path in (("flows_first_page", "/flows"),
                       ("flows_filtered", "/flows?state=FAILURE&name=order-4"),
                       ("flows_deep_page_offset", f"/flows?page={deep}"),
                       ("flows_deep_page_keyset",
                        "/flows?" + urllib.parse.urlencode({"page": deep, "after": after})),
                       ("flows_page_1000", "/flows?page=1000"),
                       ("small_flow_page", f"/flows/{small}"),
                       ("big_flow_page", f"/flows/{big}")):
        log(f"timing {path}")
        results[name] = timed(get(path), repeat)
    return results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def push_delay(data: DashboardData, broker: dict[str, Any], count: int) -> dict[str, Any]:
    """Milliseconds from emitting an event to reading it from the page's event stream."""
    import httpx
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(data), host="127.0.0.1", port=port,
                                           access_log=False, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    while not data.hub.listening.is_set():
        time.sleep(0.05)
    flow = str(uuid.uuid4())
    delays: list[float] = []
    hello = threading.Event()
    done = threading.Event()

    def follow() -> None:
        with httpx.stream("GET", f"http://127.0.0.1:{port}/events?flow={flow}",
                          timeout=30.0) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: hello"):
                    hello.set()
                elif line.startswith("data: ") and line != "data: {}":
                    event = json.loads(line[6:])
                    delays.append(time.time() - float(event["timestamp"]))
                    if len(delays) >= count:
                        done.set()
                        return

    threading.Thread(target=follow, daemon=True).start()
    hello.wait(30.0)
    publisher = EventPublisher(**broker)
    for index in range(count):
        publisher.emit("task-progress", flow_uuid=flow, task_name="bench", progress=index)
        time.sleep(0.02)  # one event at a time: a delay, not a batch's throughput
    done.wait(30.0)
    server.should_exit = True
    if not delays:
        return {"events": 0}
    ordered = sorted(delays)
    return {"events": len(delays), "median_ms": round(statistics.median(ordered) * 1000, 2),
            "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1] * 1000, 2),
            "max_ms": round(ordered[-1] * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=100_000)
    parser.add_argument("--atoms", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--deep-page", type=int, default=500,
                        help="the deep page timed (at most the last page)")
    options = parser.parse_args()
    deep = max(2, min(options.deep_page, options.flows // 50))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette's note about httpx's successor
        from starlette.testclient import TestClient
    # The big flow's factory must be importable by name to be rebuilt: this module is.
    me = importlib.import_module("dashboard")
    with tempfile.TemporaryDirectory() as tmp:
        backend = backends.fetch(f"sqlite:///{Path(tmp) / 'flows.db'}")
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
        log(f"storing {options.flows} flows")
        started = time.perf_counter()
        fill(backend, options.flows)
        fill_s = time.perf_counter() - started
        log(f"running a flow of {options.atoms} atoms")
        small = run_stored(backend, me.big_flow, [4])
        big = run_stored(backend, me.big_flow, [options.atoms])
        (Path(tmp) / "queues").mkdir()
        broker = {"exchange": "bench-dashboard", "transport": "flowengine-fs",
                  "transport_options": {"data_folder": str(Path(tmp) / "queues")}}
        data = DashboardData(backend, EventHub(lambda: EventReceiver(**broker)), broker)
        with TestClient(create_app(DashboardData(backend, EventHub(None)))) as client:
            results = pages(client, small, big, options.repeat, deep,
                            deep_cursor(backend, deep))
        log("measuring the pushed updates' delay")
        delay = push_delay(data, broker, options.events)
        backend.close()
    first = results["flows_first_page"]["median_ms"]
    print(json.dumps({
        "benchmark": "dashboard",
        "python": platform.python_version(),
        "stored_flows": options.flows + 2, "big_flow_atoms": options.atoms, "deep_page": deep,
        "fill_s": round(fill_s, 2), "pages": results, "push_delay": delay,
        "target": {"flows_first_page_ms": 300, "met": first < 300},
    }, indent=2))


if __name__ == "__main__":
    main()
