"""Processes for test_persistence_concurrency: writers, readers, engines and a lock holder.

Usage::

    python _persistence_writer.py URI BOOK_UUID NAME FLOW_COUNT [WRITERS]
    python _persistence_writer.py --engines URI BOOK_UUID NAME FLOW_COUNT
    python _persistence_writer.py --hold-lock PATH SECONDS

Every mode prints ``ready`` and waits for a line on stdin, so all processes start together
(``--hold-lock`` prints ``holding`` once it holds the lock, and needs no go-ahead).

* A writer (no WRITERS argument), for each flow: adds it with three task details to the shared
  logbook, moves every task to SUCCESS with a result naming the writer, and marks the flow
  SUCCESS, through the connection API.
* A reader (WRITERS given) reloads the logbook until WRITERS * FLOW_COUNT flows are SUCCESS, and
  exits with status 1 if it ever sees a flow without its three task details (half of a save).
* ``--engines`` runs FLOW_COUNT real flows (parallel engine, ``TASKS`` tasks each, every task
  reading the previous one's result) through ``engines.load(...).run()``, each in a flow detail
  of the shared logbook.
* ``--hold-lock`` takes the exclusive ``flock`` a dir backend takes to write, on PATH, and keeps
  it until a line arrives on stdin or SECONDS pass.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import sys

from flowengine import engines, states, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models

#: Tasks per flow in ``--engines`` mode.
TASKS = 4


def main(uri: str, book_uuid: str, writer: str, count: int) -> None:
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(count):
            book = conn.get_logbook(book_uuid, lazy=True)
            flow = models.FlowDetail(f"{writer}-{i}", uuid=f"{writer}-flow-{i}")
            tasks = [models.TaskDetail(f"t{n}", uuid=f"{writer}-{i}-t{n}") for n in range(3)]
            for task_detail in tasks:
                flow.add(task_detail)
            book.add(flow)
            conn.save_logbook(book)
            for task_detail in tasks:
                task_detail.put(states.SUCCESS,
                                {"writer": writer, "flow": i, "task": task_detail.name})
                conn.update_atom_details(task_detail)
            flow.state = states.SUCCESS
            conn.update_flow_details(flow)
    print("done", flush=True)


def read(uri: str, book_uuid: str, count: int, writers: int) -> None:
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        print("ready", flush=True)
        sys.stdin.readline()
        loads = 0
        while True:
            book = conn.get_logbook(book_uuid)
            loads += 1
            for flow in book:
                if len(flow) != 3:
                    sys.exit(f"load {loads}: flow {flow.uuid} has {len(flow)} task details")
            if sum(flow.state == states.SUCCESS for flow in book) == writers * count:
                break
    print(f"done after {loads} loads", flush=True)


class Step(task.Task):
    """Returns the previous step's result with its own name appended."""

    def execute(self, trail: list[str]) -> list[str]:
        return [*trail, self.name]


def engine_flow(name: str) -> linear_flow.Flow:
    """Task ``t<n>`` reads ``r<n>`` and provides ``r<n+1>``; ``r0`` is given with ``store``."""
    return linear_flow.Flow(name).add(
        *(Step(f"t{n}", provides=f"r{n + 1}", rebind={"trail": f"r{n}"}) for n in range(TASKS)))


def run_engines(uri: str, book_uuid: str, runner: str, count: int) -> None:
    with backends.backend(uri) as backend:
        with contextlib.closing(backend.get_connection()) as conn:
            book = conn.get_logbook(book_uuid, lazy=True)
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(count):
            engine = engines.load(engine_flow(f"{runner}-{i}"), store={"r0": [runner, str(i)]},
                                  book=book, backend=backend, engine="parallel")
            engine.run()
    print("done", flush=True)


def hold_lock(path: str, seconds: float) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("holding", flush=True)
    # Released when told to, or at the deadline: a test whose backend never gives up then
    # fails on a save that did not time out, instead of hanging.
    select.select([sys.stdin], [], [], seconds)
    os.close(fd)


if __name__ == "__main__":
    if sys.argv[1] == "--hold-lock":
        hold_lock(sys.argv[2], float(sys.argv[3]))
    elif sys.argv[1] == "--engines":
        run_engines(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif len(sys.argv) > 5:
        read(sys.argv[1], sys.argv[2], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
