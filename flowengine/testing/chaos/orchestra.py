"""Running a chaos session: workers and an engine process, the schedule applied to them, the
flows drained, the certificate made.

Timeline: the worker processes start (flowengine's, each logging the requests it runs; or
TaskFlow's own with ``taskflow``), then the engine process; the seeded schedule's faults are
applied at their moments for ``duration`` seconds, a killed worker's slot filled again after a
moment and a frozen one thawed after its freeze; then every worker is back, the engine is told
to start no more flows, and gets ``settle`` seconds to end the ones it runs. What has not ended
then hung. Everything lands in the work folder: the store (SQLite unless another backend is
given), the engine's and the workers' logs, each process's output, the faults applied.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowengine import engines
from flowengine.testing import kit, processes
from flowengine.testing.chaos import certify as ct
from flowengine.testing.chaos import schedule as sc
from flowengine.testing.chaos.engine_process import Config

TOPIC = "chaos"
ENGINE_LOG = "engine.jsonl"
WORKERS_LOG = "workers.jsonl"
FAULTS_LOG = "faults.jsonl"


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

    @property
    def store_uri(self) -> str:
        """Where the flows are stored."""
        return self.backend or f"sqlite:///{self.workdir / 'chaos.db'}"

    def replay(self) -> str:
        """The command that replays this session's schedule (the broker URL's password left
        out)."""
        from flowengine.persistence.backends._uri import mask_urls

        words = ["flowengine", "chaos", self.spec, "--duration", f"{self.duration:g}",
                 "--workers", str(self.workers), "--seed", str(self.seed)]
        if self.broker.url:
            words += ["--url", mask_urls(self.broker.url)]
        if self.taskflow:
            words.append("--taskflow-compat")
        return shlex.join(words)


class Session:
    """One chaos session (see the module docstring).

    Args:
        settings: What to run.
        say: Told what happens, a line at a time.
    """

    def __init__(self, settings: Settings, say: Callable[[str], None]) -> None:
        self.settings, self.say = settings, say
        self.dir = settings.workdir
        self.prefix = f"chaos-{settings.seed}"
        self._slots: list[processes.Child | None] = []
        self._retired: list[processes.Child] = []
        self._names = itertools.count(1)
        self._engines = itertools.count(1)
        self._engine: processes.Child | None = None
        self._applied: list[ct.Applied] = []
        self._specs: list[str] = []

    # -- processes ----------------------------------------------------------------------------

    def _worker(self) -> processes.Child:
        name = f"worker-{next(self._names)}"
        if self.settings.taskflow:
            return processes.taskflow_worker(name, self.dir, self.settings.broker, TOPIC,
                                             self._specs)
        return processes.flowengine_worker(
            name, self.dir, self.settings.broker, TOPIC, self._specs, self.settings.threads,
            extra=["--events-log", str(self.dir / WORKERS_LOG)])

    def _start_engine(self) -> processes.Child:
        number = next(self._engines)
        settings = self.settings
        ready = self.dir / f"engine-{number}.ready"
        config = Config(
            factory=settings.spec, args=settings.args, kwargs=settings.kwargs,
            store=settings.store, backend=settings.store_uri, prefix=self.prefix,
            broker={k: v for k, v in settings.broker.engine_options().items() if v is not None},
            topic=TOPIC, concurrency=settings.concurrency, log=str(self.dir / ENGINE_LOG),
            drain=str(self.dir / "drain"), ready=str(ready),
            options={"lease_timeout": settings.lease_timeout,
                     "heartbeat_interval": settings.heartbeat_interval})
        path = self.dir / "engine-config.json"
        config.save(path)
        return processes.Child(f"engine-{number}",
                               [sys.executable, "-m", "flowengine.testing.chaos.engine_process",
                                str(path)], self.dir, ready=ready)

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
        faults = sc.schedule(settings.seed, settings.duration, settings.workers,
                             settings.lease_timeout)
        self.say(f"chaos: {settings.duration:g}s, {settings.workers} "
                 f"{'TaskFlow ' if settings.taskflow else ''}workers, seed {settings.seed}, "
                 f"{len(faults)} faults scheduled; work folder {self.dir}")
        try:
            self._slots = [self._worker() for _ in range(settings.workers)]
            for child in self._slots:
                if child is not None:
                    child.wait_ready()
            self._engine = self._start_engine()
            self._engine.wait_ready()
            self._play(faults)
            self._drain()
        finally:
            self._stop_all()
        return ct.certify(settings.seed, settings.replay(), settings.store_uri, self.prefix,
                          self.dir / ENGINE_LOG, self.dir / WORKERS_LOG, self._applied)

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
            at = fault.at
            if fault.kind == sc.RESTART_ENGINE:
                assert self._engine is not None
                pid = self._engine.pid
                self._record(fault, pid, self._engine.name)
                self._engine.kill()
                self._engine = self._start_engine()
                return
            slot = self._usable(fault.slot)
            if slot is None:
                self.say(f"chaos: {fault}: no worker to strike, skipped")
                return
            child = self._slots[slot]
            assert child is not None
            self._record(fault, child.pid, child.name)
            if fault.kind == sc.KILL_WORKER:
                child.kill()
                self._slots[slot] = None
                heapq.heappush(due, (at + fault.hold, next(order), lambda: self._fill(slot)))
            elif fault.kind == sc.FREEZE_WORKER:
                child.freeze()
                heapq.heappush(due, (at + fault.hold, next(order), child.thaw))
            else:  # restart: the old one finishes or hands back its work, a new one starts
                child.signal(signal.SIGTERM)
                self._retired.append(child)
                self._slots[slot] = self._worker()

        return apply

    def _usable(self, slot: int) -> int | None:
        """``slot``, or the next one whose worker is alive and not frozen."""
        count = len(self._slots)
        for step in range(count):
            index = (slot + step) % count
            child = self._slots[index]
            if child is not None and child.alive and not child.frozen:
                return index
        return None

    def _fill(self, slot: int) -> None:
        if self._slots[slot] is None:
            self._slots[slot] = self._worker()

    def _record(self, fault: sc.Fault, pid: int, name: str) -> None:
        applied = ct.Applied(fault, time.time(), pid, name)
        self._applied.append(applied)
        with open(self.dir / FAULTS_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({"t": applied.t, "pid": pid, "process": name,
                                  **dataclasses.asdict(fault)}) + "\n")
        self.say(f"chaos: {fault}: {name} (pid {pid})")

    def _drain(self) -> None:
        for index, child in enumerate(self._slots):  # every worker back for the drain
            if child is None:
                self._fill(index)
            elif child.frozen:
                child.thaw()
        (self.dir / "drain").touch()
        engine = self._engine
        assert engine is not None
        self.say(f"chaos: over; the flows get {self.settings.settle:g}s to end")
        try:
            engine.proc.wait(timeout=self.settings.settle)
        except subprocess.TimeoutExpired:  # what still runs hung
            self.say("chaos: flows still running after the settling time: stopping the engine")
            engine.kill()

    def _stop_all(self) -> None:
        children = [c for c in [*self._slots, *self._retired, self._engine] if c is not None]
        for child in children:
            if child.frozen:
                child.thaw()
            child.signal(signal.SIGTERM)
        for child in children:
            child.stop()

