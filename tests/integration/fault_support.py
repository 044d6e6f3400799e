"""Support for the fault-injection tests: the task ledger, gates, engines on threads, broker
outages, memory sampling and the operator CLI.

Everything waits on a condition with a deadline (:func:`wait_until`); nothing sleeps to
synchronise. The only deliberate sleep is the length of a broker outage, which is the fault
itself.

Import canary: a worker process given ``FAULT_IMPORT_CANARY=<path>`` in its environment creates
that file if it ever imports this module, and ``<path>.instantiated`` if it ever builds a
:class:`CanaryError`. Hostile failure payloads name both, so the files' absence shows that a
worker treated the names as data.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Set only in workers' environments (see the module docstring).
IMPORT_CANARY_ENV = "FAULT_IMPORT_CANARY"

if os.environ.get(IMPORT_CANARY_ENV):  # before anything else, so even a failed import counts
    Path(os.environ[IMPORT_CANARY_ENV]).touch()


class CanaryError(Exception):
    """Building one (from a name in a message) leaves ``<canary>.instantiated`` behind."""

    def __init__(self, *args: object) -> None:
        if os.environ.get(IMPORT_CANARY_ENV):
            Path(os.environ[IMPORT_CANARY_ENV] + ".instantiated").touch()
        super().__init__(*args)


# ruff: noqa: E402 -- the canary above must run before these imports.
import contextlib
import dataclasses
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import fault_tasks
import kombu
from wbe_harness import REPO, Broker, WorkerFleet, WorkerProcess, subprocess_env

from flowengine.testing import ledger as lg

T = TypeVar("T")

#: Seconds the tests allow for what should take a fraction of that (bounded waits, not sleeps).
WAIT = 30.0


def wait_until(predicate: Callable[[], T], timeout: float, what: str,
               details: Callable[[], object] | None = None, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise AssertionError(f"{what}: not within {timeout}s{extra}")
        time.sleep(interval)


# ---- the ledger and the gates --------------------------------------------------------------------


_EVENTS = {line: event for event, line in fault_tasks.LINES.items()}


def _event(entry: lg.Entry) -> dict[str, Any]:
    """A ledger line as the event the tests match: ``{"atom", "event", "pid", "t", ...}``."""
    return {"atom": entry.atom, "event": _EVENTS[(entry.kind, entry.action)],
            "pid": int(str(entry.worker).rpartition(":")[2]), "t": entry.t, **entry.details}


@dataclasses.dataclass
class Ledger:
    """Reads what :mod:`fault_tasks` wrote (complete lines only), oldest first: the events as
    dicts, or :attr:`kit` for flowengine.testing's queries and assertions over the same lines.
    """

    path: Path
    kit: lg.FileLedger = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.kit = lg.FileLedger(self.path)

    def lines(self) -> list[dict[str, Any]]:
        return [_event(e) for e in self.kit.entries() if (e.kind, e.action) in _EVENTS]

    def events(self, atom: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        return [line for line in self.lines()
                if (atom is None or line["atom"] == atom)
                and (event is None or line["event"] == event)]

    def starts(self, atom: str) -> list[dict[str, Any]]:
        return self.events(atom, fault_tasks.EXECUTE_START)

    def ends(self, atom: str) -> list[dict[str, Any]]:
        return self.events(atom, fault_tasks.EXECUTE_END)

    def reverts(self, atom: str) -> list[dict[str, Any]]:
        return self.events(atom, fault_tasks.REVERT_END)

    def wait_for(self, atom: str, event: str, count: int = 1, timeout: float = WAIT,
                 where: Callable[[dict[str, Any]], bool] = lambda _line: True,
                 ) -> list[dict[str, Any]]:
        """Wait until ``atom`` wrote ``event`` ``count`` times (matching ``where``); return them."""
        def found() -> list[dict[str, Any]] | None:
            lines = [line for line in self.events(atom, event) if where(line)]
            return lines if len(lines) >= count else None

        return wait_until(found, timeout, f"{count} x {event} of {atom!r} in the ledger",
                          details=self.dump)

    def assert_ran_once(self, atom: str) -> None:
        """``atom``'s execute started once (flowengine.testing's judgement) and ended once."""
        self.kit.assert_ran_once(atom)
        assert len(self.ends(atom)) == 1, (atom, self.dump())

    def dump(self) -> str:
        return "--- ledger\n" + "\n".join(json.dumps(line) for line in self.lines())


@dataclasses.dataclass
class Gates:
    """Opens the gates :class:`fault_tasks.Gate` tasks wait on."""

    directory: Path

    def open(self, atom: str, pid: int | None = None) -> None:
        name = atom if pid is None else f"{atom}.{pid}"
        (self.directory / name).touch()


@dataclasses.dataclass
class Stage:
    """One test's ledger, gates, canary and worker environment."""

    ledger: Ledger
    gates: Gates
    canary: Path
    cured: Path

    @classmethod
    def make(cls, root: Path) -> Stage:
        gates = root / "gates"
        gates.mkdir(parents=True, exist_ok=True)
        return cls(Ledger(root / "ledger.jsonl"), Gates(gates), root / "canary",
                   root / "cured")

    @property
    def env(self) -> dict[str, str]:
        """What worker processes need in their environment."""
        return {fault_tasks.LEDGER_ENV: str(self.ledger.path),
                fault_tasks.GATES_ENV: str(self.gates.directory),
                fault_tasks.CURED_ENV: str(self.cured),
                IMPORT_CANARY_ENV: str(self.canary)}

    def canaries(self) -> list[Path]:
        """Canary files that exist (none should)."""
        return [p for p in self.canary.parent.glob(self.canary.name + "*")]


# ---- engines on threads --------------------------------------------------------------------------


class EngineRun:
    """``engine.run()`` on a thread of its own; :meth:`join` gives what it raised (or None)."""

    def __init__(self, engine: Any, name: str = "engine") -> None:
        self.engine = engine
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.finished: float | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.engine.run()
        except BaseException as err:  # kept for the test to look at
            self.error = err
        finally:
            self.finished = time.monotonic()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float, details: Callable[[], object] | None = None,
             ) -> BaseException | None:
        """What ``run()`` raised (None if nothing); fail if it still runs after ``timeout``."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            extra = f"\n{details()}" if details is not None else ""
            raise AssertionError(
                f"engine {self._thread.name} still running after {timeout}s{extra}")
        return self.error

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started


class EngineRuns:
    """Starts :class:`EngineRun` s; :meth:`close` (at teardown) suspends those still running,
    so a failed test leaves no engine behind to log into later tests."""

    def __init__(self) -> None:
        self.runs: list[EngineRun] = []

    def start(self, engine: Any, name: str = "engine") -> EngineRun:
        run = EngineRun(engine, name)
        self.runs.append(run)
        return run

    def close(self, timeout: float = WAIT) -> None:
        for run in self.runs:
            if not run.done:
                with contextlib.suppress(Exception):  # it may be finishing right now
                    run.engine.suspend()
        for run in self.runs:
            with contextlib.suppress(AssertionError):
                run.join(timeout)


# ---- worker processes ----------------------------------------------------------------------------


def by_pid(workers: list[WorkerProcess], pid: int) -> WorkerProcess:
    [worker] = [w for w in workers if w.pid == pid]
    return worker


def logs(workers: list[WorkerProcess]) -> str:
    """Each worker's state and the end of its output (for assertion messages)."""
    return "\n".join(w.failure(f"alive={w.alive}") for w in workers)


class Keeper:
    """Keeps ``count`` workers of one topic running, restarting them as they die, until the
    block ends (a context manager).

    A replacement may die before it is even seen announcing itself (it takes the poisoned
    request at once); that is one more death, not an error.

    Args:
        fleet: Starts the replacements; every worker of ``topic`` in it is watched.
        topic, tasks, threads: As for :meth:`WorkerFleet.start`.
        count: How many workers to keep alive.
    """

    def __init__(self, fleet: WorkerFleet, topic: str, tasks: list[str], threads: int,
                 count: int) -> None:
        self._fleet, self._topic, self._tasks, self._threads = fleet, topic, tasks, threads
        self._count = count
        self.deaths: dict[int, int | None] = {}  # pid -> exit code
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keeper", daemon=True)

    @property
    def workers(self) -> list[WorkerProcess]:
        return [w for w in self._fleet.workers if w.topic == self._topic]

    def _run(self) -> None:
        while not self._stop.is_set():
            for worker in self.workers:
                if worker.pid not in self.deaths and not worker.alive:
                    self.deaths[worker.pid] = worker.proc.returncode
            if sum(w.alive for w in self.workers) < self._count:
                try:
                    self._fleet.start(self._topic, self._tasks, threads=self._threads)
                except AssertionError as err:
                    if self.workers[-1].alive:  # it did not die: it never came up
                        self.errors.append(err)
                        return
                continue
            self._stop.wait(0.05)

    def __enter__(self) -> Keeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.errors and exc_info[0] is None:
            raise AssertionError(f"restarting a worker failed: {self.errors[0]}")


# ---- broker outages ------------------------------------------------------------------------------

#: Where ``.ci/services.sh`` keeps the servers' state.
SERVICES_DIR = Path(os.environ.get("FLOWENGINE_SERVICES_DIR", "/tmp/flowengine-services"))
SERVICES_SH = REPO / ".ci" / "services.sh"
#: Seconds a server gets to stop or come back.
SERVER_TIMEOUT = 90.0


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _run(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=SERVER_TIMEOUT)


class _Server:
    """One of the servers ``.ci/services.sh`` runs: stop it and bring it back, alone."""

    port: int

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        return port_open(self.port)

    def kill(self) -> None:
        """Stop the server for good, whatever state it is in, so ``.ci/services.sh start``
        can start it afresh (it starts only servers whose port is closed)."""


class _Redis(_Server):
    """Shut down *with* a snapshot (the test servers run with ``--save ''``), so a restart loses
    nothing, as a production Redis with persistence would; the snapshot is removed once loaded,
    so a later ``services.sh stop`` and ``start`` does not bring stale data back."""

    port = 6379
    dump = SERVICES_DIR / "dump.rdb"

    def stop(self) -> None:
        _run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "shutdown", "save"])

    def start(self) -> None:
        # The arguments of .ci/services.sh, so the restarted server is the same server.
        _run(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--daemonize",
              "yes", "--save", "", "--appendonly", "no", "--dir", str(SERVICES_DIR),
              "--logfile", str(SERVICES_DIR / "redis.log")])

    def ready(self) -> bool:
        if not port_open(self.port):
            return False
        answer = _run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "ping"])
        if answer.stdout.strip() != "PONG":
            return False
        with contextlib.suppress(FileNotFoundError):
            self.dump.unlink()
        return True


class _RabbitMQ(_Server):
    """Stops the RabbitMQ application (every connection closes and the port with it; durable
    queues and persistent messages stay on disk) and starts it again; the Erlang node stays."""

    port = 5672
    env = {"RABBITMQ_NODENAME": "rabbit@localhost"}

    def stop(self) -> None:
        _run(["rabbitmqctl", "stop_app"], self.env)

    def start(self) -> None:
        _run(["rabbitmqctl", "start_app"], self.env)

    def kill(self) -> None:
        # The Erlang node outlives a hung start_app, and services.sh would not start a second
        # node of the same name beside it: stop the node, by force if it does not answer.
        with contextlib.suppress(subprocess.TimeoutExpired):
            _run(["rabbitmqctl", "stop"], self.env)
        for pid in _pids_of_node(self.env["RABBITMQ_NODENAME"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _pids_of_node(nodename: str) -> list[int]:
    """The Erlang VMs running RabbitMQ node ``nodename`` (the name is in their environment,
    not on their command line; the cluster suite's nodes have names of their own)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or "beam" not in (proc / "comm").read_text():
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if f"RABBITMQ_NODENAME={nodename}".encode() in environ:
            found.append(int(proc.name))
    return found


def rabbitmq_queue(queue: str) -> tuple[int, int] | None:
    """``(ready, unacknowledged)`` messages of the test RabbitMQ's queue ``queue`` (None: no
    such queue), from ``rabbitmqctl``: AMQP tells how many messages are ready, not how many
    consumers hold."""
    listed = _run(["rabbitmqctl", "list_queues", "-q", "--no-table-headers", "name",
                   "messages_ready", "messages_unacknowledged"], _RabbitMQ.env)
    listed.check_returncode()
    for line in listed.stdout.splitlines():
        name, ready, unacked = line.split("\t")
        if name == queue:
            return int(ready), int(unacked)
    return None


class PrivateBeanstalkd(_Server):
    """A beanstalkd of one test's own, on a free port, with its binlog in ``folder`` (so a
    restart keeps its jobs; ``binlog=False``: a restart starts empty, bindings and all); the
    shared test server is never stopped. A context manager."""

    def __init__(self, folder: Path, binlog: bool = True) -> None:
        self.folder, self.binlog = folder, binlog
        folder.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.broker = Broker("beanstalk", f"beanstalk://127.0.0.1:{self.port}")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binlog = ["-b", str(self.folder)] if self.binlog else []
        self._process = subprocess.Popen(
            ["beanstalkd", "-l", "127.0.0.1", "-p", str(self.port), *binlog],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(SERVER_TIMEOUT)

    def __enter__(self) -> PrivateBeanstalkd:
        _PRIVATE[self.broker.url] = self
        self.start()
        wait_until(self.ready, SERVER_TIMEOUT, "private beanstalkd starting", interval=0.05)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _PRIVATE.pop(self.broker.url, None)
        self.stop()


_PRIVATE: dict[str, _Server] = {}


def _server_for(broker: Broker) -> _Server:
    if broker.url in _PRIVATE:
        return _PRIVATE[broker.url]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test` runs the suite on several pytest processes at once; stopping a server
        # they share would fail their tests. Such a test is marked `exclusive` and runs alone.
        raise AssertionError(f"this test stops the shared {broker.name} server while other "
                             "tests run beside it: mark it @pytest.mark.exclusive")
    parsed = urllib.parse.urlsplit(broker.url)
    server = {"redis": _Redis, "rabbitmq": _RabbitMQ}[broker.name]()
    if parsed.hostname not in ("127.0.0.1", "localhost") or (parsed.port or server.port) != \
            server.port:
        raise AssertionError(f"{broker.name} at {broker.url} is not the local test server this "
                             f"test stops and starts (127.0.0.1:{server.port})")
    return server


@contextlib.contextmanager
def broker_outage(broker: Broker, seconds: float) -> Iterator[None]:
    """Stop ``broker``'s server (the block runs once it is down), keep it down ``seconds`` in
    all, then start it again and wait until it answers.

    Whatever happens, the server is running again afterwards: if it does not come back by
    itself, ``.ci/services.sh start`` starts it.
    """
    server = _server_for(broker)
    stopped = time.monotonic()
    try:
        server.stop()
        wait_until(lambda: not port_open(server.port), SERVER_TIMEOUT,
                   f"{broker.name} stopping")
        stopped = time.monotonic()
        yield
        remaining = seconds - (time.monotonic() - stopped)
        if remaining > 0:
            time.sleep(remaining)  # the outage itself, not a synchronisation
    finally:
        try:
            server.start()
            wait_until(server.ready, SERVER_TIMEOUT, f"{broker.name} restarting", interval=0.1)
        except (AssertionError, subprocess.TimeoutExpired) as err:
            # The server's own restart failed or hung (RabbitMQ's start_app did in CI while
            # its node had too few file handles, see .ci/services.sh): the outage still
            # happened, so the test goes on with the server started afresh, and says so in the
            # run's warnings.
            warnings.warn(f"{broker.name} did not come back by itself ({err}); "
                          "started afresh by .ci/services.sh", stacklevel=1)
            server.kill()
            _run(["bash", str(SERVICES_SH), "start"])
            wait_until(server.ready, SERVER_TIMEOUT, f"{broker.name} started by services.sh",
                       interval=0.1)


# ---- memory --------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class RssSampler:
    """Samples processes' RSS every ``interval`` seconds on a thread (a context manager)."""

    def __init__(self, pids: list[int], interval: float = 0.05) -> None:
        self.samples: dict[int, list[int]] = {pid: [] for pid in pids}
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, samples in self.samples.items():
                value = rss_kib(pid)
                if value is not None:
                    samples.append(value)
            self._stop.wait(self._interval)

    def peak(self, pid: int) -> int:
        return max(self.samples[pid], default=0)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)


# ---- the operator CLI and raw queue access -------------------------------------------------------


def flowengine_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``flowengine ARGS`` as an operator would (a process of its own)."""
    return subprocess.run([sys.executable, "-m", "flowengine.cli.main", *args], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


@dataclasses.dataclass
class Taken:
    """A message removed from a queue: enough to publish it again as it was."""

    body: bytes
    properties: dict[str, Any]
    headers: dict[str, Any]


def take_one(url: str, queue: str, timeout: float = WAIT) -> Taken:
    """Remove the next message waiting in ``queue`` (waiting for one up to ``timeout``)."""
    with kombu.Connection(url) as conn, conn.channel() as channel:
        bound = kombu.Queue(queue, channel=channel, no_declare=True)
        message = wait_until(lambda: bound.get(no_ack=False, accept=["application/json"]),
                             timeout, f"a message in {queue}")
        taken = Taken(message.body if isinstance(message.body, bytes)
                      else str(message.body).encode(),
                      dict(message.properties), dict(message.headers or {}))
        message.ack()
        return taken
