"""Two conductors share a Redis jobboard; one is killed mid-job and the other finishes it.

The script posts a three-step "provision-server" job to a jobboard on Redis (claims last 3 s),
then starts two ``flowengine conductor`` processes. Whichever claims the job runs ``allocate``
and starts ``install``; the script then kills that conductor with SIGKILL, as an OOM kill or a
lost machine would. Its claim is no longer renewed, so Redis ends it within 3 s; the other
conductor, woken by that, claims the job, resumes the flow from the SQLite file they share and
runs only what never finished: ``install`` again (it was cut off) and ``configure``. ``allocate``
ran once. The tasks write what ran, and in which process, to a ledger file.

Needs Redis (FLOWENGINE_REDIS_URL, default redis://127.0.0.1:6379/0).
Run: python examples/jobboard_failover.py
"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from flowengine import task
from flowengine.flows import linear_flow
from flowengine.jobs import backends
from flowengine.jobs.posting import post_flow
from flowengine.persistence import backends as persistence_backends

REDIS_URL = os.environ.get("FLOWENGINE_REDIS_URL", "redis://127.0.0.1:6379/0")
CLAIM_TTL = 3


class Step(task.Task):
    """Appends ``started``/``done`` lines to the ledger; ``install`` waits for ``release``."""

    def execute(self, ledger: str, release: str) -> None:
        with open(ledger, "a") as out:
            out.write(f"started {self.name} {os.getpid()}\n")
        if self.name == "install":
            while not Path(release).exists():
                time.sleep(0.05)
        with open(ledger, "a") as out:
            out.write(f"done {self.name} {os.getpid()}\n")


def provision() -> linear_flow.Flow:
    """The flow factory conductors import by name (``jobboard_failover.provision``)."""
    return linear_flow.Flow("provision-server").add(
        Step("allocate"), Step("install"), Step("configure"))


def ledger_lines(ledger: Path) -> list[list[str]]:
    return [line.split() for line in ledger.read_text().splitlines()] if ledger.exists() else []


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"gave up waiting for {what}")
        time.sleep(0.02)  # other processes' files: nothing to wait on but the file itself


def start_conductor(name: str, namespace: str, db: Path, logs: Path) -> subprocess.Popen:
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(here), str(here.parent), os.environ.get("PYTHONPATH")]))}
    log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        [sys.executable, "-m", "flowengine.cli.main", "conductor", "--board", REDIS_URL,
         "--board-option", f"namespace={namespace}", "--board-option", f"claim_ttl={CLAIM_TTL}",
         "--backend", f"sqlite:///{db}", "--name", name, "--max-jobs", "1"],
        cwd=here, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def main() -> None:
    namespace = f"failover-{uuid.uuid4().hex[:8]}"
    conf = {"board": REDIS_URL, "namespace": namespace, "claim_ttl": CLAIM_TTL}
    with contextlib.ExitStack() as stack:
        # Removed last (after the conductors are killed): their store, logs and the ledger.
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="failover-")))
        ledger, release = workdir / "ledger", workdir / "release"
        db = workdir / "flows.db"
        persistence = stack.enter_context(persistence_backends.backend(f"sqlite:///{db}"))
        board = stack.enter_context(backends.backend("example", conf))
        processes = {name: start_conductor(name, namespace, db, workdir)
                     for name in ("alpha", "beta")}
        for process in processes.values():
            stack.callback(process.kill)
        wait_until(lambda: len(board.iter_entities("conductor")) == 2, 30, "both conductors")
        print("conductors:", ", ".join(e.name.split("@")[0] for e in
                                        board.iter_entities("conductor")))
        job = post_flow(board, persistence, "jobboard_failover.provision", name="provision-server",
                        store={"ledger": str(ledger), "release": str(release)})
        print(f"posted job {job.name}")
        wait_until(lambda: ["started", "install"] in [line[:2] for line in ledger_lines(ledger)],
                   30, "install to start")
        victim_pid = int(ledger_lines(ledger)[-1][2])
        victim = next(n for n, p in processes.items() if p.pid == victim_pid)
        survivor = "beta" if victim == "alpha" else "alpha"
        print(f"{victim} claimed the job and is running install")
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        release.touch()
        print(f"killed {victim} (SIGKILL)")
        job.wait(timeout=60)
        print(f"{survivor} finished the job {time.monotonic() - killed_at:.1f}s after the kill"
              f" (claims last {CLAIM_TTL}s)")
        for name in ("allocate", "install", "configure"):
            runs = [line for line in ledger_lines(ledger) if line[:2] == ["done", name]]
            where = {victim_pid: victim}.get(int(runs[0][2]), survivor) if runs else "-"
            print(f"{name}: completed {len(runs)} time(s), by {where}")
        processes[survivor].send_signal(signal.SIGTERM)
        processes[survivor].wait(30)


if __name__ == "__main__":
    main()
