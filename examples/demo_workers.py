"""The `make run` demo: a flow whose tasks run in two worker processes, then a failure undone.

1. Starts two ``flowengine worker`` processes on one topic over the ``flowengine-fs`` transport
   (queues are files in a temporary folder, so no broker is needed) and waits until both have
   announced themselves.
2. Runs a provisioning graph flow on them, showing one live line per atom: its state, progress,
   the worker that ran it and how long it took.
3. Runs it again with a failing health check: the workers revert the completed steps, in the
   reverse of the order they ran in, and the demo prints that order.
4. Stops the workers with SIGTERM and checks that each exits with code 0, also after an error or
   Ctrl-C.

Run: make run    (or: python examples/demo_workers.py)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import demo_tasks
from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from worker_processes import TRANSPORT, WorkerProcess, listening_executor, worker_processes

from flowengine import engines, exceptions, task
from flowengine.flows import graph_flow
from flowengine.persistence import backends, models
from flowengine.persistence.base import IncompatibleSchema
from flowengine.types import notifier
from flowengine.worker_based.executor import WorkerTaskExecutor

EXCHANGE = "demo"
TOPIC = "provisioning"
WORKER_NAMES = ("worker-1", "worker-2")
THREADS_PER_WORKER = 2
#: Where the runs are stored, for ``flowengine dashboard`` (kept after the demo ends);
#: ``FLOWENGINE_DEMO_STORE`` names another store (the tests give each run its own).
STORE = os.environ.get("FLOWENGINE_DEMO_STORE",
                       f"sqlite:///{tempfile.gettempdir()}/flowengine-demo.db")

console = Console(highlight=False, soft_wrap=True)
STYLES = {
    "PENDING": "dim",
    "RUNNING": "cyan",
    "SUCCESS": "green",
    "FAILURE": "red",
    "REVERTING": "yellow",
    "REVERTED": "yellow",
}


def report_exit(worker: WorkerProcess, code: int | None) -> None:
    if code == 0:
        console.print(f"{worker.name} stopped: [green]exit code 0[/]")
    else:
        what = "killed after ignoring SIGTERM" if code is None else f"exit code {code}"
        console.print(f"{worker.name} stopped: [red]{what}[/]\n{worker.log_tail()}")


# -- the live board -------------------------------------------------------------------------


@dataclasses.dataclass
class AtomLine:
    name: str
    state: str = "PENDING"
    progress: float = 0.0
    ran_on: str = ""
    undone_on: str = ""
    failed: bool = False
    started: float | None = None
    ended: float | None = None
    revert_started: float | None = None
    revert_ended: float | None = None


def _seconds(start: float | None, end: float | None, now: float) -> str:
    return "" if start is None else f"{(end or now) - start:.2f}s"


class Board:
    """One line per atom, fed by the engine's notifications (which come from several threads)."""

    def __init__(self, names: list[str]) -> None:
        self._lines = {name: AtomLine(name) for name in names}
        self._lock = threading.Lock()
        self.reverted: list[str] = []

    def on_atom(self, state: str, details: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            line = self._lines[details["task_name"]]
            line.state = state
            if state == "RUNNING":
                line.started = now
            elif state in ("SUCCESS", "FAILURE"):
                line.ended = now
                line.progress = 1.0 if state == "SUCCESS" else line.progress
                line.failed = state == "FAILURE"
            elif state == "REVERTING":
                line.revert_started = now
            elif state == "REVERTED":
                line.revert_ended = now
                self.reverted.append(line.name)

    def on_progress(self, _event: str, name: str, details: dict[str, Any]) -> None:
        with self._lock:
            line = self._lines[name]
            worker = details.get("worker") or ""
            if line.state == "RUNNING":
                line.progress = details["progress"]
                line.ran_on = worker or line.ran_on
            elif line.state == "REVERTING":
                line.undone_on = worker or line.undone_on

    def render(self) -> Table:
        now = time.monotonic()
        with self._lock:
            lines = list(self._lines.values())
            undo = any(line.revert_started is not None for line in lines)
            table = Table("atom", "state", "progress", "ran on", "took", box=None, padding=(0, 1))
            if undo:
                table.add_column("undone on")
                table.add_column("took")
            for line in lines:
                cells: list[RenderableType] = [
                    line.name,
                    f"[{STYLES.get(line.state, '')}]{line.state}[/]"
                    + (" [red]✘[/]" if line.failed and line.state != "FAILURE" else ""),
                    ProgressBar(total=1.0, completed=line.progress, width=10),
                    line.ran_on,
                    _seconds(line.started, line.ended, now),
                ]
                if undo:
                    cells += [line.undone_on, _seconds(line.revert_started, line.revert_ended, now)]
                table.add_row(*cells)
        return table


# -- the flow -------------------------------------------------------------------------------


def build_flow() -> graph_flow.Flow:
    """No links are declared: the order follows from what each step requires and provides."""
    return graph_flow.Flow("provision-server").add(
        demo_tasks.AllocateIp("allocate_ip"),
        demo_tasks.CreateVolume("create_volume"),
        demo_tasks.FetchImage("fetch_image"),
        demo_tasks.BootServer("boot_server"),
        demo_tasks.AttachVolume("attach_volume"),
        demo_tasks.HealthCheck("health_check"),
    )


def run(executor: WorkerTaskExecutor, simulate_outage: bool, backend: Any = None) -> list[str]:
    """Run the flow on the workers; return the names of the reverted atoms, in order."""
    flow = build_flow()
    engine = engines.load(
        flow, engine="worker-based", executor=executor, store={"simulate_outage": simulate_outage},
        backend=backend, book=models.LogBook("make-run"),
    )
    board = Board([atom.name for atom in engine.compilation.iter_atoms()])
    for step in flow:
        step.notifier.register(task.EVENT_UPDATE_PROGRESS, board.on_progress, args=(step.name,))
    engine.atom_notifier.register(notifier.Notifier.ANY, board.on_atom)
    started = time.monotonic()
    try:
        with Live(get_renderable=board.render, console=console, refresh_per_second=12):
            try:
                engine.run()
            except exceptions.WrappedFailure as err:
                # Remote failures arrive as data, so run() re-raises them wrapped.
                failure = err[0]
                console.print(
                    f"engine.run() raised WrappedFailure: {failure.exc_type_names[0]}:"
                    f" {failure.exception_str}"
                )
    finally:
        if not console.is_terminal:
            console.line()  # rich ends a live display with a newline on terminals only
    console.print(
        f"flow state: [bold]{engine.storage.get_flow_state()}[/]"
        f" ({time.monotonic() - started:.2f}s)"
    )
    return board.reverted


def main() -> None:
    with listening_executor(EXCHANGE, TOPIC, prefix="flowengine-demo-") as (executor, data_folder):
        console.print(f"transport: {TRANSPORT} (messages are files under {data_folder})")
        started = time.monotonic()
        with worker_processes(
            WORKER_NAMES, executor, EXCHANGE, TOPIC, ["demo_tasks"], data_folder,
            threads=THREADS_PER_WORKER, on_exit=report_exit,
        ) as workers:  # fmt: skip
            pids = ", ".join(f"{w.name} (pid {w.process.pid})" for w in workers)
            console.print(
                f"started {pids} on topic '{TOPIC}'; both announced themselves"
                f" in {time.monotonic() - started:.2f}s"
            )
            with backends.backend(STORE) as backend:
                console.rule("[bold]1. provisioning a server on two workers")
                run(executor, simulate_outage=False, backend=backend)
                console.rule("[bold]2. the same flow with a failing health check")
                reverted = run(executor, simulate_outage=True, backend=backend)
            console.print("revert order: " + " -> ".join(reverted))
            console.print(f"see both runs in a browser: {dashboard_command()}")
            console.rule("[bold]3. stopping the workers (SIGTERM)")


def dashboard_command() -> str:
    """The command that shows this script's runs in a browser, as this shell can run it.

    ``make run`` runs the script with ``.venv/bin/python`` without activating the venv, so a
    bare ``flowengine`` may not be on PATH: then the venv's script is named by its path.
    """
    script = Path(sys.executable).parent / "flowengine"
    on_path = shutil.which("flowengine")
    command = "flowengine" if on_path and Path(on_path).resolve() == script.resolve() else (
        os.path.relpath(script) if script.is_relative_to(Path.cwd()) else str(script))
    hint = "" if importlib.util.find_spec("starlette") else (
        "  (needs the dashboard extra: pip install -e '.[dashboard]')")
    return f"{command} dashboard --backend {STORE}{hint}"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        sys.exit(130)
    except IncompatibleSchema as exc:
        # A store kept from a newer flowengine: say so and leave it as it is.
        console.print(f"[red]{exc}[/]\nset FLOWENGINE_DEMO_STORE to another store"
                      " (sqlite:///PATH) or delete that file")
        sys.exit(1)
