"""Revert rehearsal: fail a flow at every point, and judge how it undoes its work.

:func:`rehearse` runs the flow a factory builds again and again on one *stage* (an engine with
its workers), each time with faults injected at another *failure point*:

1. once without any fault (the baseline: it must succeed; it tells which atoms run, in order);
2. for every task, with its ``execute`` failing (every attempt, so a retry controller gives
   up): the flow must end REVERTED;
3. for every task, with its ``revert`` failing, while the last task of the baseline fails so
   that everything before it is undone: the flow must end FAILURE with that task in
   REVERT_FAILURE;
4. once with every revert made twice in a row (the last task failing): the flow must end
   REVERTED and each second call must change nothing.

Each run's ledger is judged (:func:`flowengine.testing.judge.compensation`); the
:class:`Report` prints a matrix, failure point by atom, and a verdict. Stages: the test kit's
(serial, parallel, or worker-based with workers in this process) and :class:`ProcessStage`
(worker processes on a real broker, or on the embedded filesystem transport).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import os
import signal
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flowengine import engines, states
from flowengine import task as task_mod
from flowengine.engines import interception
from flowengine.testing import effects, judge, kit, processes, skipping
from flowengine.testing import faults as fl
from flowengine.testing import ledger as lg
from flowengine.testing.clock import ManualClock

#: Files of a rehearsal's folder shared with its worker processes.
LEDGER_FILE = "ledger.jsonl"
PLAN_FILE = "plan.json"
#: Real seconds one run may take (default).
RUN_TIMEOUT = 60.0

BASELINE = "baseline"
EXECUTE = "execute"
REVERT = "revert"
TWICE = "twice"
#: A finding about how a run ended (not one of the judge's checks).
ENDING = "flow ending"

LEGEND = ("E executed   x execute failed on purpose   F execute raised   . did not run\n"
          "/R reverted   /R+R reverted, then again on purpose   /X revert failed on purpose   "
          "! finding")


# ---- the plan in force, shared with worker processes --------------------------------------------


def write_plan(directory: Path, plan: fl.Plan) -> None:
    """Put ``plan`` in force for the worker processes reading ``directory`` (atomically)."""
    data = {"run": plan.run, "faults": [f.to_dict() for f in plan.faults]}
    partial = directory / f".{PLAN_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(data), encoding="utf-8")
    partial.replace(directory / PLAN_FILE)


class _PlanFile:
    """The plan a worker process reads before each call (again only once the file changed)."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / PLAN_FILE
        self._seen: tuple[int, int] | None = None
        self._plan = fl.Plan(None)
        self._lock = threading.Lock()

    def __call__(self) -> fl.Plan:
        with self._lock:
            try:
                stat = self._path.stat()
            except FileNotFoundError:
                return self._plan
            if (stat.st_mtime_ns, stat.st_ino) != self._seen:
                data = json.loads(self._path.read_text(encoding="utf-8"))
                self._plan = fl.Plan(data.get("run"),
                                     tuple(fl.Fault.from_dict(f) for f in data["faults"]))
                self._seen = (stat.st_mtime_ns, stat.st_ino)
            return self._plan


def recorder(ledger: lg.Ledger, directory: Path) -> fl.Recorder:
    """The interceptor of a rehearsal's worker process: the plan from ``directory``."""
    return fl.Recorder(ledger, _PlanFile(directory))


# ---- failure points, runs and the report --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Point:
    """One failure point: a row of the matrix.

    Attributes:
        kind: :data:`BASELINE`, :data:`EXECUTE`, :data:`REVERT` or :data:`TWICE`.
        target: The atom failed on purpose (None for the baseline and the twice row).
        faults: What is injected.
    """

    kind: str
    target: str | None
    faults: tuple[fl.Fault, ...] = ()

    @property
    def label(self) -> str:
        """The row's name."""
        if self.kind == BASELINE:
            return "no fault (baseline)"
        if self.kind == TWICE:
            return "every revert twice"
        return f"fail {self.kind} of {self.target}"


@dataclasses.dataclass
class Run:
    """One run of the rehearsal and its judgement."""

    point: Point
    state: str
    atom_states: dict[str, str]
    entries: list[lg.Entry]
    findings: list[judge.Finding]
    error: str | None = None

    def cell(self, atom: str) -> str:
        """What happened to ``atom`` in this run (see :data:`LEGEND`)."""
        mine = [e for e in self.entries if e.atom == atom]
        done = ""
        if any(e.kind == lg.FAULT and e.action == "execute" for e in mine):
            done = "x"
        elif any(e.kind == lg.RETURN and e.action == "execute" and e.outcome == lg.RETURNED
                 for e in mine):
            done = "E"
        elif any(e.kind == lg.RETURN and e.action == "execute" for e in mine):
            done = "F"
        undone = ""
        if any(e.kind == lg.FAULT and e.action == "revert" for e in mine):
            undone = "X"
        else:
            reverts = [e for e in mine if e.kind == lg.CALL and e.action == "revert"]
            firsts = sum(not e.repeat for e in reverts)
            undone = "R" * firsts + "+R" * (len(reverts) - firsts)
        text = done + (f"/{undone}" if undone else "") or "."
        return text + ("!" if any(f.atom == atom for f in self.findings) else "")


@dataclasses.dataclass
class Report:
    """What a rehearsal found.

    Attributes:
        stage: Where it ran (engine and workers).
        atoms: The flow's tasks, in the order the baseline ran them.
        runs: Every run, the baseline first.
    """

    stage: str
    atoms: list[str]
    runs: list[Run]

    @property
    def findings(self) -> list[tuple[Run, judge.Finding]]:
        """Every finding, with its run."""
        return [(run, finding) for run in self.runs for finding in run.findings]

    @property
    def safe(self) -> bool:
        """Whether nothing was found."""
        return not self.findings

    def matrix(self) -> str:
        """The failure point x atom matrix, one run a line."""
        rows = [["failure point", *self.atoms, "flow ended", "verdict"]]
        for run in self.runs:
            rows.append([run.point.label, *(run.cell(a) for a in self.atoms), run.state,
                         "FINDING" if run.findings else "ok"])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                         for row in rows)

    def verdict(self) -> str:
        """One line, then one per finding."""
        found = self.findings
        head = (f"verdict: {len(self.runs)} runs on {self.stage}, "
                + (f"{len(found)} finding(s): the flow is NOT proven safe" if found
                   else "no finding: every failure point is undone safely"))
        lines = [head]
        for run, finding in found:
            lines.append(f"  {run.point.label}: {finding}")
        return "\n".join(lines)

    def text(self) -> str:
        """The matrix, its legend and the verdict."""
        return f"{self.matrix()}\n\n{LEGEND}\n\n{self.verdict()}"

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data."""
        return {"stage": self.stage, "atoms": self.atoms, "safe": self.safe,
                "runs": [{"point": r.point.label, "kind": r.point.kind,
                          "target": r.point.target, "state": r.state,
                          "cells": {a: r.cell(a) for a in self.atoms},
                          "findings": [dataclasses.asdict(f) for f in r.findings],
                          "error": r.error} for r in self.runs]}


# ---- stages -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Ran:
    """What a stage hands back from one run."""

    engine: Any
    error: BaseException | None
    entries: list[lg.Entry]


class Stage(abc.ABC):
    """An engine and its workers that runs a flow with a plan of faults in force."""

    name: str

    @abc.abstractmethod
    def open(self) -> None:
        """Make ready (start workers...)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything (stop workers...)."""

    @abc.abstractmethod
    def run(self, flow: Any, store: Mapping[str, Any], plan: fl.Plan) -> Ran:
        """Run ``flow`` to its end with ``plan`` in force."""


class KitStage(Stage):
    """The test kit: a local engine, or the worker-based one with workers in this process.

    Args:
        engine: ``serial``, ``parallel`` or ``worker-based``.
        timeout: Real seconds a run may take.
    """

    def __init__(self, engine: str, timeout: float = RUN_TIMEOUT) -> None:
        self._kit = kit.TestKit(engine=engine, timeout=timeout)
        self.name = (f"the {engine} engine" if engine != "worker-based" else
                     "the worker-based engine, workers in this process (memory transport)")

    def open(self) -> None:
        self._kit.start()

    def close(self) -> None:
        self._kit.close()

    def run(self, flow: Any, store: Mapping[str, Any], plan: fl.Plan) -> Ran:
        self._kit.ledger.reset_world(plan.run)
        self._kit.clear_faults()
        for fault in plan.faults:
            self._kit.inject(fault)
        outcome = self._kit.run(flow, store=store)
        return Ran(outcome.engine, outcome.error, self._kit.ledger.entries(outcome.run))


class ProcessStage(Stage):
    """The worker-based engine in this process, its workers in processes of their own.

    Args:
        directory: The rehearsal's folder (ledger, plan, worker logs; the embedded transport's
            data when no broker is given).
        broker: Where engine and workers meet (no URL nor transport: flowengine-fs in
            ``directory``).
        workers: How many worker processes.
        threads: Task threads of each.
        timeout: Real seconds a run may take.
    """

    TOPIC = "rehearse"

    def __init__(self, directory: Path, broker: processes.BrokerOptions, workers: int,
                 threads: int = 4, timeout: float = RUN_TIMEOUT) -> None:
        if broker.url is None and broker.transport is None:
            broker = dataclasses.replace(
                broker, transport="flowengine-fs",
                transport_options={"data_folder": str(directory / "fs")})
        self.directory, self.broker = directory, broker
        self._count, self._threads, self._timeout = workers, threads, timeout
        self._ledger = lg.FileLedger(directory / LEDGER_FILE)
        self._clock = ManualClock()
        self._skipper = skipping.WaitSkipper(self._clock)  # leases keep the real clock
        self._workers: list[processes.Child] = []
        self._specs: list[str] | None = None
        self._stack = contextlib.ExitStack()
        where = broker.url or broker.transport
        self.name = f"the worker-based engine, {workers} worker process(es) on {where}"

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_plan(self.directory, fl.Plan(None))
        self._stack.enter_context(interception.installed(recorder(self._ledger,
                                                                   self.directory)))
        previous = effects.use(self._ledger)
        self._stack.callback(effects.use, previous)
        self._skipper.start()
        self._stack.callback(self._skipper.stop)

    def close(self) -> None:
        for worker in self._workers:  # all at once: each may take a while to finish
            worker.signal(signal.SIGTERM)
        for worker in self._workers:
            worker.stop()
        self._stack.close()

    def _start_workers(self, specs: list[str]) -> None:
        if self._specs == specs:
            return
        if self._specs is not None:
            raise RuntimeError("a rehearsal's flows must all run the same task classes")
        self._specs = specs
        self._workers = [processes.flowengine_worker(
            f"worker-{n}", self.directory, self.broker, self.TOPIC, specs, self._threads,
            extra=["--rehearsal", str(self.directory)]) for n in range(1, self._count + 1)]
        for worker in self._workers:
            worker.wait_ready()

    def run(self, flow: Any, store: Mapping[str, Any], plan: fl.Plan) -> Ran:
        self._ledger.reset_world(plan.run)
        write_plan(self.directory, plan)
        engine = engines.load(flow, store=dict(store), engine="worker-based",
                              topics=[self.TOPIC], retry_clock=self._clock, events=False,
                              **self.broker.engine_options())
        self._start_workers(processes.task_specs(kit.task_classes(engine)))
        self._skipper.watch(engine)
        raised: list[BaseException] = []

        def run() -> None:
            try:
                engine.run()
            except BaseException as err:  # judged, not raised
                raised.append(err)

        runner = threading.Thread(target=run, name="rehearsal-run", daemon=True)
        runner.start()
        runner.join(self._timeout)
        if runner.is_alive():
            engine.suspend()
            runner.join(5.0)
            raise RuntimeError(f"run {plan.run} of flow {engine.storage.flow_name!r} did not "
                               f"end within {self._timeout}s; worker logs are in "
                               f"{self.directory}")
        return Ran(engine, raised[0] if raised else None, self._ledger.entries(plan.run))


# ---- the rehearsal ------------------------------------------------------------------------------


def _describe(error: BaseException | None) -> str | None:
    if error is None:
        return None
    carried = list(error) if type(error).__name__ == "WrappedFailure" else []  # type: ignore
    if carried:
        return "; ".join(str(getattr(f, "exception_str", f)) for f in carried)
    return f"{type(error).__name__}: {error}"


def _judged(point: Point, ran: Ran) -> Run:
    engine = ran.engine
    storage = engine.storage
    state = str(storage.get_flow_state())
    atom_states = {a.name: str(storage.get_atom_state(a.name))
                   for a in engine.compilation.iter_atoms()}
    expected = states.SUCCESS if point.kind == BASELINE else states.REVERTED
    revert_failed = point.kind == REVERT and any(
        e.kind == lg.FAULT and e.atom == point.target and e.action == "revert"
        for e in ran.entries)
    if revert_failed:
        expected = states.FAILURE
    findings = judge.compensation(ran.entries, kit.dependencies(engine),
                                  kit.tolerant_atoms(engine),
                                  all_reverted=expected == states.REVERTED)
    at = point.target or "-"
    if state != expected:
        findings.append(judge.Finding(at, ENDING, f"the flow ended {state}, not {expected}"
                                      + (f" ({_describe(ran.error)})" if ran.error else "")))
    elif revert_failed and point.target is not None:
        named = atom_states.get(point.target)
        if named != states.REVERT_FAILURE:
            findings.append(judge.Finding(point.target, ENDING,
                                          f"its failed revert left it {named}, not "
                                          f"REVERT_FAILURE"))
    return Run(point, state, atom_states, ran.entries, findings, _describe(ran.error))


def _order(baseline: Ran) -> list[str]:
    """The tasks in the order the baseline started them; those it never ran after."""
    tasks = [a.name for a in baseline.engine.compilation.iter_atoms()
             if isinstance(a, task_mod.Task)]
    started = []
    for entry in baseline.entries:
        if entry.kind == lg.CALL and entry.action == "execute" and entry.atom in tasks:
            if entry.atom not in started:
                started.append(entry.atom)
    return started + [t for t in tasks if t not in started]


def _last_completed(baseline: Ran, order: Sequence[str]) -> str:
    done = [e.atom for e in baseline.entries
            if e.kind == lg.RETURN and e.action == "execute" and e.outcome == lg.RETURNED]
    return str(done[-1]) if done else order[-1]


def points(order: Sequence[str], last: str) -> list[Point]:
    """The failure points after the baseline (see the module docstring)."""
    found = [Point(EXECUTE, atom, (fl.fail_execute(atom),)) for atom in order]
    found += [Point(REVERT, atom, (fl.fail_execute(last), fl.fail_revert(atom)))
              for atom in order]
    found.append(Point(TWICE, None, (fl.fail_execute(last), fl.revert_twice())))
    return found


def rehearse(factory: Callable[[], Any], store: Mapping[str, Any], stage: Stage,
             progress: Callable[[str], None] | None = None) -> Report:
    """Run the rehearsal of the flow ``factory`` builds on ``stage`` (opened and closed here).

    Args:
        factory: Builds the flow (called once per run).
        store: The flow's inputs.
        stage: Where it runs.
        progress: Told the label of each run as it starts.
    """
    tell = progress or (lambda _label: None)
    prefix = uuid.uuid4().hex[:6]
    stage.open()
    try:
        tell(Point(BASELINE, None).label)
        baseline = stage.run(factory(), store, fl.Plan(f"{prefix}-0"))
        order = _order(baseline)
        runs = [_judged(Point(BASELINE, None), baseline)]
        if runs[0].state == states.SUCCESS and order:
            for number, point in enumerate(points(order, _last_completed(baseline, order)), 1):
                tell(point.label)
                ran = stage.run(factory(), store, fl.Plan(f"{prefix}-{number}", point.faults))
                runs.append(_judged(point, ran))
        return Report(stage.name, order, runs)
    finally:
        stage.close()
