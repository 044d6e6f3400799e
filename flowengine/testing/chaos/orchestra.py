"""Running a chaos session: workers and an engine process (or conductors of a jobboard), the
schedule applied to them, the flows drained, the certificate made.

Timeline: the worker processes start (flowengine's, each logging the requests it runs; or
TaskFlow's own with ``taskflow``), then the engine process, or, with a jobboard, the conductor
processes and the poster that keeps ``concurrency`` jobs on the board; the seeded schedule's
faults are applied at their moments for ``duration`` seconds, a killed process's slot filled
again after a moment and a frozen one thawed after its freeze; then every worker and conductor
is back, no new flow starts, and the flows get ``settle`` seconds to end. What has not ended
then hung. Everything lands in the work folder: the store (SQLite unless another backend is
given), the engine's (or the conductors') and the workers' logs, each process's output, the
faults applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import json
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowengine import engines
from flowengine.testing import kit, processes
from flowengine.testing.chaos import certify as ct
from flowengine.testing.chaos import conductor_process
from flowengine.testing.chaos import jobs as jb
from flowengine.testing.chaos import schedule as sc
from flowengine.testing.chaos.engine_process import Config

TOPIC = "chaos"
ENGINE_LOG = "engine.jsonl"
CONDUCTORS_LOG = "conductors.jsonl"
WORKERS_LOG = "workers.jsonl"
FAULTS_LOG = "faults.jsonl"


@dataclasses.dataclass(frozen=True)
class Board:
    """The jobboard a session's flows are posted to as jobs, and its conductors.

    Attributes:
        uri: The board's URI, as the user gave it.
        options: Its conf keys (``--board-option``), ``claim_ttl`` included.
        conductors: Conductor slots.
        max_jobs: Jobs each conductor runs at once.
    """

    uri: str
    options: dict[str, Any]
    conductors: int = 3
    max_jobs: int = 4

    @property
    def claim_ttl(self) -> float:
        """Seconds a claim lasts (a conductor's freeze lasts past it)."""
        return float(self.options["claim_ttl"])

    def conf(self, location: str) -> dict[str, Any]:
        """The board's conf, with the session's jobs kept under ``location``, apart from any
        other job of the board's server (see :func:`~.jobs.own_location`)."""
        return {"board": self.uri, **self.options, **jb.own_location(self.uri, location)}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a chaos session runs, for how long, and where.

    Attributes:
        spec: ``MODULE:FACTORY`` of the flow.
        args, kwargs: The factory's arguments.
        store: The flow's inputs (each instance also gets ``chaos_instance``).
        duration: Seconds of chaos.
        workers: Worker slots.
        seed: The schedule's seed.
        broker: Where workers and engine meet.
        workdir: The work folder.
        backend: The store's URI (default: SQLite in the work folder).
        concurrency: Flows the engine runs at once.
        settle: Seconds the flows get to end once the chaos is over.
        lease_timeout, heartbeat_interval: The engine's lease on running requests.
        threads: Task threads of each worker.
        taskflow: Run TaskFlow's own workers (and its topology).
        board: Post the flows as jobs on this board, run by conductors (None: one engine
            process runs them).
    """

    spec: str
    args: list[Any]
    kwargs: dict[str, Any]
    store: dict[str, Any]
    duration: float
    workers: int
    seed: int
    broker: processes.BrokerOptions
    workdir: Path
    backend: str | None = None
    concurrency: int = 8
    settle: float = 60.0
    lease_timeout: float = 5.0
    heartbeat_interval: float = 1.0
    threads: int = 4
    taskflow: bool = False
    board: Board | None = None

    @property
    def store_uri(self) -> str:
        """Where the flows are stored."""
        return self.backend or f"sqlite:///{self.workdir / 'chaos.db'}"

    def replay(self) -> str:
        """The command that replays this session's schedule (the broker URL's password left
        out)."""
        from flowengine.persistence.backends._uri import mask_urls

        words = ["flowengine", "chaos", self.spec, "--duration", f"{self.duration:g}",
                 "--workers", str(self.workers), "--seed", str(self.seed),
                 "--lease-timeout", f"{self.lease_timeout:g}"]
        if self.broker.url:
            words += ["--url", mask_urls(self.broker.url)]
        if self.taskflow:
            words.append("--taskflow-compat")
        if self.board is not None:
            words += ["--board", mask_urls(self.board.uri), "--conductors",
                      str(self.board.conductors), "--claim-ttl", f"{self.board.claim_ttl:g}"]
        return shlex.join(words)




class Pool:
    """Slots of one kind of process (workers, or conductors), each holding one process or,
    for a moment after a kill, none.

    Args:
        kind: What the processes are (``worker``, ``conductor``), for messages.
        count: Slots.
        start: Starts a process for a slot.
    """

    def __init__(self, kind: str, count: int, start: Callable[[], processes.Child]) -> None:
        self.kind, self._start = kind, start
        self.slots: list[processes.Child | None] = [None] * count
        self.retired: list[processes.Child] = []

    def start_all(self) -> None:
        """A process in every slot, serving."""
        self.slots = [self._start() for _ in self.slots]
        for child in self.slots:
            if child is not None:
                child.wait_ready()

    def usable(self, slot: int) -> int | None:
        """``slot``, or the next one whose process is alive and not frozen."""
        count = len(self.slots)
        for step in range(count):
            index = (slot + step) % count
            child = self.slots[index]
            if child is not None and child.alive and not child.frozen:
                return index
        return None

    def kill(self, slot: int) -> None:
        """SIGKILL the slot's process; the slot stays empty until :meth:`fill`."""
        child = self.slots[slot]
        assert child is not None
        child.kill()
        self.slots[slot] = None

    def fill(self, slot: int) -> None:
        """A new process in ``slot`` if it is empty."""
        if self.slots[slot] is None:
            self.slots[slot] = self._start()

    def restart(self, slot: int) -> None:
        """SIGTERM the slot's process (it finishes or hands back its work) and start a new
        one in its place at once."""
        child = self.slots[slot]
        assert child is not None
        child.signal(signal.SIGTERM)
        self.retired.append(child)
        self.slots[slot] = self._start()

    def restore(self) -> None:
        """Every slot back: killed ones filled, frozen ones thawed."""
        for index, child in enumerate(self.slots):
            if child is None:
                self.fill(index)
            elif child.frozen:
                child.thaw()

    def children(self) -> list[processes.Child]:
        """Every process it started that may still run."""
        return [c for c in [*self.slots, *self.retired] if c is not None]


class Session:
    """One chaos session (see the module docstring).

    Args:
        settings: What to run.
        say: Told what happens, a line at a time.
    """

    def __init__(self, settings: Settings, say: Callable[[str], None]) -> None:
        self.settings, self.say = settings, say
        self.dir = settings.workdir
        # Unique even in a store other sessions share (--backend): the certificate reads the
        # logbooks named after it.
        self.prefix = f"chaos-{settings.seed}-{uuid.uuid4().hex[:6]}"
        self._names = itertools.count(1)
        self._conductor_names = itertools.count(1)
        self._engines = itertools.count(1)
        self._engine: processes.Child | None = None
        self.workers = Pool("worker", settings.workers, self._worker)
        self.conductors: Pool | None = None
        self._applied: list[ct.Applied] = []
        self._specs: list[str] = []
        self._poster: jb.Poster | None = None

    # -- processes ----------------------------------------------------------------------------

    def _worker(self) -> processes.Child:
        name = f"worker-{next(self._names)}"
        if self.settings.taskflow:
            return processes.taskflow_worker(name, self.dir, self.settings.broker, TOPIC,
                                             self._specs)
        return processes.flowengine_worker(
            name, self.dir, self.settings.broker, TOPIC, self._specs, self.settings.threads,
            extra=["--events-log", str(self.dir / WORKERS_LOG)])

    def _engine_options(self) -> dict[str, Any]:
        settings = self.settings
        return {**{k: v for k, v in settings.broker.engine_options().items() if v is not None},
                "lease_timeout": settings.lease_timeout,
                "heartbeat_interval": settings.heartbeat_interval}

    def _start_engine(self) -> processes.Child:
        number = next(self._engines)
        settings = self.settings
        ready = self.dir / f"engine-{number}.ready"
        options = self._engine_options()
        config = Config(
            factory=settings.spec, args=settings.args, kwargs=settings.kwargs,
            store=settings.store, backend=settings.store_uri, prefix=self.prefix,
            broker={k: v for k, v in options.items()
                    if k not in ("lease_timeout", "heartbeat_interval")},
            topic=TOPIC, concurrency=settings.concurrency, log=str(self.dir / ENGINE_LOG),
            drain=str(self.dir / "drain"), ready=str(ready),
            options={"lease_timeout": settings.lease_timeout,
                     "heartbeat_interval": settings.heartbeat_interval})
        path = self.dir / "engine-config.json"
        config.save(path)
        return processes.Child(f"engine-{number}",
                               [sys.executable, "-m", "flowengine.testing.chaos.engine_process",
                                str(path)], self.dir, ready=ready)

    def _conductor(self) -> processes.Child:
        name = f"conductor-{next(self._conductor_names)}"
        path = self.dir / "conductor-config.json"
        return processes.Child(
            name, [sys.executable, "-m", "flowengine.testing.chaos.conductor_process", str(path),
                   name], self.dir, ready=self.dir / f"{name}.ready")

    def _write_conductor_config(self, board: Board) -> None:
        config = conductor_process.Config(
            board=board.conf(self.prefix), backend=self.settings.store_uri,
            engine_options={**self._engine_options(), "topics": [TOPIC], "events": False},
            max_jobs=board.max_jobs, log=str(self.dir / CONDUCTORS_LOG),
            ready_dir=str(self.dir))
        config.save(self.dir / "conductor-config.json")

    def _task_specs(self) -> list[str]:
        from flowengine.cli import loading

        target = loading.import_target(self.settings.spec)
        flow = loading.build_flow(self.settings.spec, target, self.settings.args,
                                  self.settings.kwargs)
        engine = engines.load(flow, engine="serial", store=self.settings.store)
        return processes.task_specs(kit.task_classes(engine))

    # -- the session --------------------------------------------------------------------------

    def run(self) -> ct.Certificate:
        """Start everything, apply the schedule, drain, stop, certify."""
        settings = self.settings
        self.dir.mkdir(parents=True, exist_ok=True)
        self._specs = self._task_specs()
        board = settings.board
        faults = sc.schedule(settings.seed, settings.duration, settings.workers,
                             settings.lease_timeout,
                             conductors=board.conductors if board else 0,
                             claim_ttl=board.claim_ttl if board else 0.0)
        where = (f"{board.conductors} conductors on {self._board_uri()} (jobs under "
                 f"{self.prefix}), " if board else "")
        self.say(f"chaos: {settings.duration:g}s, {settings.workers} "
                 f"{'TaskFlow ' if settings.taskflow else ''}workers, {where}seed "
                 f"{settings.seed}, {len(faults)} faults scheduled; work folder {self.dir}")
        if board is None:
            return self._run_engine(faults)
        return self._run_board(board, faults)

    def _board_uri(self) -> str:
        from flowengine.persistence.backends._uri import mask_urls

        assert self.settings.board is not None
        return mask_urls(self.settings.board.uri)

    def _run_engine(self, faults: list[sc.Fault]) -> ct.Certificate:
        settings = self.settings
        try:
            self.workers.start_all()
            self._engine = self._start_engine()
            self._engine.wait_ready()
            self._play(faults)
            self._drain_engine()
        finally:
            self._stop_all()
        return ct.certify(settings.seed, settings.replay(), settings.store_uri, self.prefix,
                          self.dir / ENGINE_LOG, self.dir / WORKERS_LOG, self._applied)

    def _run_board(self, board: Board, faults: list[sc.Fault]) -> ct.Certificate:
        from flowengine.cli import loading
        from flowengine.jobs import backends as boards
        from flowengine.persistence import backends

        settings = self.settings
        factory = loading.import_target(settings.spec)
        persistence = backends.fetch(settings.store_uri)
        with contextlib.closing(persistence.get_connection()) as conn:
            conn.upgrade()
        jobboard = boards.fetch("flowengine-chaos", board.conf(self.prefix),
                                persistence=persistence)
        jobboard.connect()
        self._write_conductor_config(board)
        self.conductors = Pool("conductor", board.conductors, self._conductor)
        poster = self._poster = jb.Poster(jobboard, persistence, factory, settings.args,
                                          settings.kwargs, settings.store, self.prefix,
                                          settings.concurrency, self.say)
        try:
            try:
                self.workers.start_all()
                self.conductors.start_all()
                poster.start()
                self._play(faults)
                self._drain_board(poster)
            finally:
                poster.stop()
                self._stop_all()
            census = jb.census(jobboard, persistence, poster.posted)
        finally:
            jobboard.close()
            persistence.close()
        return ct.certify(settings.seed, settings.replay(), settings.store_uri, self.prefix,
                          self.dir / CONDUCTORS_LOG, self.dir / WORKERS_LOG, self._applied,
                          jobs=census, board=(self._board_uri(), self.prefix))

    def _play(self, faults: list[sc.Fault]) -> None:
        began = time.monotonic()
        order = itertools.count()
        # (seconds after the start, order, what to do): faults and what follows them.
        due: list[tuple[float, int, Callable[[], None]]] = []
        for fault in faults:
            heapq.heappush(due, (fault.at, next(order), self._applier(fault, due, order)))
        while due:
            at, _, act = heapq.heappop(due)
            if at > self.settings.duration:
                act()  # what follows a fault (a thaw, a respawn) is done at the end anyway
                continue
            # The schedule's moments are the faults themselves: waiting for them is the point.
            time.sleep(max(0.0, began + at - time.monotonic()))
            act()
        time.sleep(max(0.0, began + self.settings.duration - time.monotonic()))

    def _applier(self, fault: sc.Fault, due: list[Any], order: Any) -> Callable[[], None]:
        def apply() -> None:
            if fault.kind == sc.RESTART_ENGINE:
                assert self._engine is not None
                self._record(fault, self._engine.pid, self._engine.name)
                self._engine.kill()
                self._engine = self._start_engine()
                return
            pool = self.conductors if fault.on_conductor else self.workers
            assert pool is not None
            slot = pool.usable(fault.slot)
            if slot is None:
                self.say(f"chaos: {fault}: no {pool.kind} to strike, skipped")
                return
            child = pool.slots[slot]
            assert child is not None
            self._record(fault, child.pid, child.name)
            if fault.kind in (sc.KILL_WORKER, sc.KILL_CONDUCTOR):
                pool.kill(slot)
                heapq.heappush(due, (fault.at + fault.hold, next(order),
                                     lambda: pool.fill(slot)))
            elif fault.kind in (sc.FREEZE_WORKER, sc.FREEZE_CONDUCTOR):
                child.freeze()
                heapq.heappush(due, (fault.at + fault.hold, next(order), child.thaw))
            else:
                pool.restart(slot)

        return apply

    def _record(self, fault: sc.Fault, pid: int, name: str) -> None:
        applied = ct.Applied(fault, time.time(), pid, name)
        self._applied.append(applied)
        with open(self.dir / FAULTS_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({"t": applied.t, "pid": pid, "process": name,
                                  **dataclasses.asdict(fault)}) + "\n")
        self.say(f"chaos: {fault}: {name} (pid {pid})")

    def _drain_engine(self) -> None:
        self.workers.restore()  # every worker back for the drain
        (self.dir / "drain").touch()
        engine = self._engine
        assert engine is not None
        self.say(f"chaos: over; the flows get {self.settings.settle:g}s to end")
        try:
            engine.proc.wait(timeout=self.settings.settle)
        except subprocess.TimeoutExpired:  # what still runs hung
            self.say("chaos: flows still running after the settling time: stopping the engine")
            engine.kill()

    def _drain_board(self, poster: jb.Poster) -> None:
        poster.stop()
        self.workers.restore()
        assert self.conductors is not None
        self.conductors.restore()
        self.say(f"chaos: over; the jobs get {self.settings.settle:g}s to end")
        if not poster.wait_drained(self.settings.settle):  # what is still on the board hung
            self.say("chaos: jobs still on the board after the settling time")

    def _stop_all(self) -> None:
        children = [*self.workers.children(), self._engine,
                    *(self.conductors.children() if self.conductors else [])]
        running = [c for c in children if c is not None]
        for child in running:
            if child.frozen:
                child.thaw()
            child.signal(signal.SIGTERM)
        for child in running:
            child.stop()
