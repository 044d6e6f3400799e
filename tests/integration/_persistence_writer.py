"""Writer and reader processes for test_persistence_concurrency, sharing one logbook.

Usage: python _persistence_writer.py URI BOOK_UUID NAME FLOW_COUNT [WRITERS]

Prints ``ready`` and waits for a line on stdin, so all processes start together. A writer (no
WRITERS argument) then, for each flow: adds it with three task details to the shared logbook,
moves every task to SUCCESS with a result naming the writer, and marks the flow SUCCESS. A reader
(WRITERS given) reloads the logbook until WRITERS * FLOW_COUNT flows are SUCCESS, and exits with
status 1 if it ever sees a flow without its three task details (half of a save).
"""

from __future__ import annotations

import contextlib
import sys

from flowengine import states
from flowengine.persistence import backends, models


def main(uri: str, book_uuid: str, writer: str, count: int) -> None:
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(count):
            book = conn.get_logbook(book_uuid, lazy=True)
            flow = models.FlowDetail(f"{writer}-{i}", uuid=f"{writer}-flow-{i}")
            tasks = [models.TaskDetail(f"t{n}", uuid=f"{writer}-{i}-t{n}") for n in range(3)]
            for task in tasks:
                flow.add(task)
            book.add(flow)
            conn.save_logbook(book)
            for task in tasks:
                task.put(states.SUCCESS, {"writer": writer, "flow": i, "task": task.name})
                conn.update_atom_details(task)
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


if __name__ == "__main__":
    if len(sys.argv) > 5:
        read(sys.argv[1], sys.argv[2], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
