"""Start and stop ``flowengine worker`` processes for the examples that use real processes.

Each worker is the ``flowengine worker`` command run with this interpreter, serving task modules
from this folder over the ``flowengine-fs`` transport (message files in a folder, no server). A
worker stops on SIGTERM: it finishes what it is running, says it is going offline and exits 0.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from flowengine.worker_based import client as broker_clients
from flowengine.worker_based.executor import WorkerTaskExecutor
from flowengine.worker_based.worker import Worker

EXAMPLES = Path(__file__).resolve().parent
TRANSPORT = "flowengine-fs"
#: Set in each worker process to the name it was started with (tasks may report it).
WORKER_NAME_ENV = "EXAMPLE_WORKER_NAME"


@dataclasses.dataclass
class WorkerProcess:
    """A started worker process; its output goes to ``log``."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the worker wrote."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def start_worker(
    name: str, exchange: str, topic: str, tasks: Sequence[str], data_folder: Path, threads: int
) -> WorkerProcess:
    """Start ``flowengine worker`` serving the task modules ``tasks`` (names under examples/)."""
    command = [
        sys.executable, "-m", "flowengine.cli.main", "worker",
        "--exchange", exchange, "--topic", topic, "--threads", str(threads), "--grace", "5",
        "--transport", TRANSPORT, "--transport-option", f"data_folder={data_folder}",
    ]  # fmt: skip
    for spec in tasks:
        command += ["--task", spec]
    env = dict(os.environ, **{WORKER_NAME_ENV: name})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES), env.get("PYTHONPATH")]))
    log = data_folder.parent / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=EXAMPLES, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return WorkerProcess(name, process, log)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds; RuntimeError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout}s")
        time.sleep(0.01)


@contextmanager
def serving(worker: Worker, start_timeout: float = 10.0) -> Iterator[Worker]:
    """Run ``worker`` on a thread of this process while inside; stop it on the way out.

    The examples that need no separate processes serve their tasks this way (``wbe_linear.py``
    spells the same steps out).
    """
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        if not worker.wait(timeout=start_timeout):
            raise RuntimeError(f"the worker did not start consuming within {start_timeout:g}s")
        yield worker
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)


def wait_until_known(
    executor: WorkerTaskExecutor, workers: Sequence[WorkerProcess], timeout: float = 60.0
) -> None:
    """Wait until ``executor`` has heard from every worker; fail early if one exits.

    The wait ends as soon as every worker has announced itself; the generous bound is for a busy
    machine, where starting a Python process that imports kombu can take many seconds.
    """
    deadline = time.monotonic() + timeout
    while executor.wait_for_workers(len(workers), timeout=0.1):
        for worker in workers:
            if worker.process.poll() is not None:
                raise RuntimeError(
                    f"{worker.name} exited with code {worker.process.returncode} at start:\n"
                    f"{worker.log_tail()}"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers did not announce themselves within {timeout}s")


def stop_workers(
    workers: Sequence[WorkerProcess],
    # A worker's stop may take its grace (5 s here) and then up to 10 s to close its control
    # consumer: 15 s was the very edge on a loaded machine.
    timeout: float = 25.0,
    on_exit: Callable[[WorkerProcess, int | None], None] | None = None,
) -> None:
    """SIGTERM every worker and wait for it; kill any still running after ``timeout`` seconds.

    ``on_exit`` gets each worker and its exit code (None if it had to be killed).
    """
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.terminate()
    deadline = time.monotonic() + timeout
    try:
        for worker in workers:
            try:
                code: int | None = worker.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                code = None
            if on_exit is not None:
                on_exit(worker, code)
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()


@contextmanager
def worker_processes(
    names: Sequence[str],
    executor: WorkerTaskExecutor,
    exchange: str,
    topic: str,
    tasks: Sequence[str],
    data_folder: Path,
    threads: int = 2,
    on_exit: Callable[[WorkerProcess, int | None], None] | None = None,
) -> Iterator[list[WorkerProcess]]:
    """Start one worker per name, wait until ``executor`` knows them all, stop them on exit.

    Start ``executor`` first: a worker announces itself once, when it connects, and only an
    executor already listening hears it.
    """
    workers: list[WorkerProcess] = []
    try:
        for name in names:
            workers.append(start_worker(name, exchange, topic, tasks, data_folder, threads))
        wait_until_known(executor, workers)
        yield workers
    finally:
        stop_workers(workers, on_exit=on_exit)


@contextmanager
def listening_executor(exchange: str, topic: str | Sequence[str],
                       prefix: str) -> Iterator[tuple[WorkerTaskExecutor, Path]]:
    """A started executor on the ``flowengine-fs`` transport in a temporary folder, asking for
    the workers of ``topic`` (one topic, or several).

    It listens before any worker starts, so their start-up announcements are heard; it is
    stopped (and the folder removed) on exit.
    """
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        data_folder = Path(tmp) / "queues"
        data_folder.mkdir()
        executor = WorkerTaskExecutor(
            uuid=uuid.uuid4().hex, exchange=exchange,
            topics=[topic] if isinstance(topic, str) else list(topic),
            transport=TRANSPORT, transport_options={"data_folder": str(data_folder)},
        )  # fmt: skip
        executor.start()
        try:
            yield executor, data_folder
        finally:
            executor.stop()
            # The process's broker client lingers a few seconds for the next engine, and its
            # consumer re-declares its queue meanwhile: close it before its folder is removed.
            broker_clients.close_all()


def report_exit(worker: WorkerProcess, code: int | None) -> None:
    """Print how a worker ended (the examples pass this as ``on_exit``)."""
    print(f"{worker.name} stopped: exit code {code}")
