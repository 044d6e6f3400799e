"""Resume a flow after its process was killed: only the tasks that were running run again.

The script starts a copy of itself that runs a nightly-report flow on the parallel engine, with a
SQLite file as its backend. While three load tasks run side by side, one of them kills its own
process with SIGKILL: no exception, no ``finally``, no clean-up, as with an OOM kill or a power
cut. The script then reads the flow detail back from the database, rebuilds the flow from the
factory recorded in it, resumes it with a new engine, and shows which tasks ran again: exactly the
ones that were in flight when the process died. Finished tasks keep their stored results.

Run: python examples/resume_after_crash.py
"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from flowengine import engines, task
from flowengine.flows import linear_flow, unordered_flow
from flowengine.persistence import backends, models

#: In the process that crashes: the task that kills it (None when resuming).
CRASH_IN: str | None = None
_OUTPUT = threading.Lock()


def say(line: str) -> None:
    """Write one whole line: tasks run on several threads, and print() writes the text and
    the newline separately, so their lines could interleave."""
    with _OUTPUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


#: The tasks this process started, in order.
STARTED: list[str] = []
_LOADS = ("load_eu", "load_us", "load_asia")
# The loads meet here before the crash, so that all three are running when it comes.
_all_loading = threading.Barrier(len(_LOADS), timeout=10)


class Step(task.Task):
    """Prints when it starts and finishes; returns how many rows it handled."""

    def __init__(self, name: str, rows: int, requires: list[str] | None = None) -> None:
        super().__init__(name=name, provides=name, requires=requires)
        self._rows = rows

    def execute(self, **inputs: int) -> int:
        STARTED.append(self.name)
        say(f"started {self.name}")
        if self.name in _LOADS and CRASH_IN is not None:
            _all_loading.wait()
            if self.name == CRASH_IN:
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2)  # the work
        say(f"finished {self.name}")
        return self._rows + sum(inputs.values())


def make_flow() -> linear_flow.Flow:
    """The flow factory: recorded in the flow detail, so another process can rebuild the flow."""
    loads = unordered_flow.Flow("load").add(
        *(Step(name, 100, requires=["transform"]) for name in _LOADS))
    return linear_flow.Flow("nightly-report").add(
        Step("extract", 1000),
        Step("transform", 10, requires=["extract"]),
        loads,
        Step("publish", 1, requires=list(_LOADS)),
    )


def crash(uri: str) -> None:
    """The first process: start the flow and die half-way (SIGKILL from inside load_asia)."""
    global CRASH_IN
    CRASH_IN = "load_asia"
    with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
        book = models.LogBook("nightly")
        conn.save_logbook(book)
        # Recorded as "__main__.make_flow": importable by this script when it resumes. In an
        # application, keep factories in a module every process can import.
        engine = engines.load_from_factory(make_flow, book=book, backend=be, engine="parallel")
        print(f"flow detail {engine.storage.flow_uuid}", flush=True)
        engine.run()


def _events(output: str, event: str) -> list[str]:
    return [line.split()[1] for line in output.splitlines() if line.startswith(f"{event} ")]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{Path(tmp) / 'flows.db'}"
        print("== first process: runs the flow, and is killed in the middle of it")
        first = subprocess.run([sys.executable, __file__, "--crash", uri],
                               capture_output=True, text=True, timeout=60)
        for line in first.stdout.splitlines():
            print(f"  | {line}")
        if first.returncode != -signal.SIGKILL:
            sys.exit(f"the first process was not killed (status {first.returncode}):\n"
                     f"{first.stderr}")
        print("first process ended by signal SIGKILL")
        flow_uuid = first.stdout.split()[2]
        started, finished = _events(first.stdout, "started"), _events(first.stdout, "finished")
        in_flight = sorted(set(started) - set(finished))
        print(f"in flight at the crash: {', '.join(in_flight)}")

        print("== resuming the flow detail from the database")
        with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
            flow_detail = conn.get_flow_details(flow_uuid)
            states = {ad.name: ad.state for ad in flow_detail}
            print("stored states: " + ", ".join(
                f"{name}={states[name]}" for name in ("extract", "transform", *_LOADS, "publish")))
            engine = engines.load_from_detail(flow_detail, backend=be, engine="parallel")
            engine.run()
            print(f"flow state: {engine.storage.get_flow_state()}")
            print(f"publish result: {engine.storage.get('publish')}")

        again = sorted(set(STARTED) & set(started))
        print(f"ran again: {', '.join(again)}")
        print(f"ran for the first time: {', '.join(sorted(set(STARTED) - set(started)))}")
        print(f"not run again: {', '.join(sorted(set(finished) - set(STARTED)))}")
        if again == in_flight:
            print("the tasks that ran again are exactly the ones in flight at the crash")
        else:
            print(f"UNEXPECTED: ran again {again}, but in flight were {in_flight}")
            sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--crash"]:
        crash(sys.argv[2])
    else:
        main()
