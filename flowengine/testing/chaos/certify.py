"""The certificate of a chaos run, from what was stored and logged.

Read: the stored flows (their final state, each atom's stored attempts and failure), the engine
processes' log (when each flow started, resumed and ended, every atom state change; with a
jobboard, the conductors' log: when each job was claimed and released, under which claim, and
every atom state change), the workers' log (when each request started and finished, on which
process; flowengine workers only), the faults applied and, with a jobboard, where every job
posted ended up (:func:`.jobs.census`). Judged:

- every flow ended SUCCESS or REVERTED (a flow still running when the chaos and its settling
  time were over *hung*; one that ended FAILURE failed);
- no completed atom ran again: once an engine recorded an atom's execute as done, no engine
  (the same one, or one that resumed the flow) started it again until it was reverted, and no
  atom's stored attempts hold two completed executes without a revert between them;
- every fault recovered: the work in flight where it struck (requests a killed or frozen worker
  held, flows a killed engine ran, jobs a killed, frozen or restarted conductor held) moved on;
  a fault's recovery time is how long the slowest of them took to end (an atom's next state,
  the flow's next step; for a conductor's job, a step made under another claim than the one
  the fault struck, or the flow's end);
- with a jobboard, every job ended: consumed, with its flow SUCCESS or REVERTED recorded as its
  ending; none left on the board (claimed or not), none in the trash, none gone without an
  ending (lost).

Reverted flows whose failure was the loss of their work (``WorkerLost``, ``RequestTimeout``)
are counted apart: safe, yet the work was lost. Delivery is at-least-once, and the workers' log
shows what that cost: requests whose execute finished twice (a frozen worker's, thawed after
its lease lapsed and another worker ran it), and requests a worker started only after their
atom had completed elsewhere (a frozen worker thawed holding one it had taken but not started;
the engine had sent it before the atom completed, and ignores its outcome). Both are counted as
information: a task that must not repeat a side effect checks for it itself. So are the runs of
conductors that lost their claim (frozen past it) and halted, reverting nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flowengine import states
from flowengine.jobs import endings
from flowengine.persistence import backends
from flowengine.testing.chaos import jobs as jb
from flowengine.testing.chaos import schedule as sc

#: Failures that mean the work was lost, not that the flow failed on its own.
LOSS = frozenset({"WorkerLost", "RequestTimeout"})
#: Atom states after which a piece of work in flight counts as moved on.
_MOVED_ON = frozenset({states.SUCCESS, states.FAILURE, states.REVERTED,
                       states.REVERT_FAILURE})
_DONE_EXECUTE = "execute"
#: Flow states a run ends in.
_ENDED = frozenset({states.SUCCESS, states.REVERTED, states.FAILURE})
#: Job endings that certify.
_GOOD_ENDINGS = frozenset({endings.SUCCESS, endings.REVERTED})


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none if it does not exist; a torn last line is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found


@dataclasses.dataclass(frozen=True)
class Applied:
    """A fault as it was applied (read back from the orchestrator's log)."""

    fault: sc.Fault
    t: float
    pid: int | None
    worker: str | None


@dataclasses.dataclass
class Recovery:
    """How one fault was recovered from."""

    applied: Applied
    affected: int
    seconds: float | None  # None: something it hit never moved on
    #: A worker fault whose work moved on only after a later engine restart (which resends
    #: what its flows wait for): recovered by that, perhaps not by the fleet.
    after_restart: bool = False

    @property
    def recovered(self) -> bool:
        """Whether everything it hit moved on."""
        return self.seconds is not None


@dataclasses.dataclass
class Jobs:
    """What became of the jobs of a session on a jobboard.

    Attributes:
        board: The board (its URI, the password left out).
        under: Where on it the session's jobs were (a Redis namespace, the name of a
            ZooKeeper or etcd path: see :func:`.jobs.own_location`).
        posted: Jobs posted.
        ended: How many ended each way (the endings recorded: SUCCESS, REVERTED, FAILED,
            TRASHED).
        left: Jobs still on the board at the end (claimed by a conductor, or not).
        trashed: Jobs in the board's trash, with why.
        lost: Jobs gone from the board with no ending recorded, their flow not ended.
        halted: Runs a conductor halted, reverting nothing, once its claim was lost.
        unrecorded: Jobs consumed with their flow SUCCESS or REVERTED whose ending was not
            recorded (their conductor was killed in between): counted as ended, by their
            flow's state.
        overwritten: Jobs that ended one way while their flow is stored another (a write
            landed after the job ended: a conductor that had lost its claim made it).
    """

    board: str
    under: str
    posted: int
    ended: dict[str, int]
    left: list[str]
    trashed: list[str]
    lost: list[str]
    halted: int
    unrecorded: list[str] = dataclasses.field(default_factory=list)
    overwritten: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether every job ended well."""
        return (self.posted > 0 and not self.left and not self.trashed and not self.lost
                and not self.overwritten and set(self.ended) <= _GOOD_ENDINGS)

    def to_json(self) -> dict[str, Any]:
        """As JSON data."""
        return dataclasses.asdict(self)


def _statistics(recoveries: Sequence[Recovery]) -> tuple[float | None, float | None]:
    """Worst (None if one never recovered) and median recovery of those that struck work."""
    hit = [r.seconds for r in recoveries if r.affected]
    done = [t for t in hit if t is not None]
    worst = None if not hit or None in hit else max(done)
    return worst, (statistics.median(done) if done else None)


@dataclasses.dataclass
class Certificate:
    """What a chaos run shows (see the module docstring)."""

    seed: int
    replay: str
    flows: int
    ended: dict[str, int]
    hung: list[str]
    failed: list[str]
    lost_work: list[str]
    reran: list[str]
    duplicates: int
    late: list[str]
    recoveries: list[Recovery]
    jobs: Jobs | None = None
    #: Requests workers started that no engine recorded sending (information; those started
    #: after their atom completed are in ``reran``).
    unrecorded: int = 0

    @property
    def hit(self) -> list[Recovery]:
        """The faults that struck work in flight."""
        return [r for r in self.recoveries if r.affected]

    @property
    def worst(self) -> float | None:
        """The slowest recovery (seconds), None if no fault hit work or one never recovered."""
        return _statistics(self.recoveries)[0]

    @property
    def median(self) -> float | None:
        """The median recovery (seconds) of the faults that hit work and recovered."""
        return _statistics(self.recoveries)[1]

    @property
    def conductor_recoveries(self) -> list[Recovery]:
        """The recoveries from faults that struck conductors."""
        return [r for r in self.recoveries if r.applied.fault.on_conductor]

    @property
    def passed(self) -> bool:
        """Whether the flow is certified."""
        return (self.flows > 0 and not self.hung and not self.failed and not self.reran
                and all(r.recovered for r in self.recoveries)
                and (self.jobs is None or self.jobs.passed))

    def text(self) -> str:
        """The certificate as lines of text."""
        ends = ", ".join(f"{n} {state}" for state, n in sorted(self.ended.items()))
        kinds: dict[str, int] = {}
        for recovery in self.recoveries:
            kinds[recovery.applied.fault.kind] = kinds.get(recovery.applied.fault.kind, 0) + 1
        lines = [
            f"flows: {self.flows} ({ends})",
            f"faults: {len(self.recoveries)} ("
            + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
            + f"), {len(self.hit)} of them struck work in flight",
            f"recovery: worst {_seconds(self.worst)}, median {_seconds(self.median)}",
        ]
        if self.jobs is not None:
            worst, median = _statistics(self.conductor_recoveries)
            jobs = self.jobs
            ends = ", ".join(f"{n} {state}" for state, n in sorted(jobs.ended.items()))
            lines += [
                f"conductor faults: recovery worst {_seconds(worst)}, median {_seconds(median)}",
                f"jobs on {jobs.board} under {jobs.under}: {jobs.posted} posted, ended "
                f"{ends or 'none'}; left on the board {len(jobs.left)}, trashed "
                f"{len(jobs.trashed)}, lost {len(jobs.lost)}, overwritten after they ended "
                f"{len(jobs.overwritten)}",
                f"runs halted by a lost claim (nothing reverted): {jobs.halted}",
                f"jobs consumed whose ending was not recorded: {len(jobs.unrecorded)}",
            ]
        lines += [
            f"completed atoms run again: {len(self.reran)}",
            f"at-least-once: requests whose execute finished twice {self.duplicates}, "
            f"requests started after their atom completed elsewhere {len(self.late)}",
            f"requests run that no engine recorded sending: {self.unrecorded}",
            f"flows reverted because their work was lost ({', '.join(sorted(LOSS))}): "
            f"{len(self.lost_work)}",
            f"worker faults recovered only after a later "
            f"{'conductor fault' if self.jobs is not None else 'engine restart'}: "
            f"{sum(r.after_restart for r in self.recoveries)}",
        ]
        if self.jobs is not None:
            lines += [f"  JOB LEFT: {j}" for j in self.jobs.left]
            lines += [f"  JOB TRASHED: {j}" for j in self.jobs.trashed]
            lines += [f"  JOB LOST: {j}" for j in self.jobs.lost]
            lines += [f"  JOB OVERWRITTEN: {j}" for j in self.jobs.overwritten]
        lines += [f"  HUNG: {h}" for h in self.hung]
        lines += [f"  FAILED: {f}" for f in self.failed]
        lines += [f"  RAN AGAIN: {r}" for r in self.reran]
        lines += [f"  LOST WORK: {w}" for w in self.lost_work]
        lines += [f"  started late: {w}" for w in self.late]
        lines += [f"  NOT RECOVERED: {r.applied.fault} (pid {r.applied.pid})"
                  for r in self.recoveries if not r.recovered]
        every = ("every job consumed and every flow ended SUCCESS or REVERTED"
                 if self.jobs is not None else "every flow ended SUCCESS or REVERTED")
        verdict = (f"CERTIFIED: {every}, no completed atom ran again, every fault recovered"
                   if self.passed else "NOT CERTIFIED")
        lines += [f"seed: {self.seed} (replay: {self.replay})", verdict]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The certificate as JSON data."""
        worst, median = _statistics(self.conductor_recoveries)
        board = ({} if self.jobs is None else
                 {"jobs": self.jobs.to_json(), "conductor_worst_recovery": worst,
                  "conductor_median_recovery": median})
        return {"passed": self.passed, "seed": self.seed, "replay": self.replay, **board,
                "flows": self.flows, "ended": self.ended, "hung": self.hung,
                "failed": self.failed, "lost_work": self.lost_work, "reran": self.reran,
                "duplicates": self.duplicates, "late": self.late,
                "unrecorded": self.unrecorded,
                "worst_recovery": self.worst,
                "median_recovery": self.median,
                "faults": [{"at": r.applied.fault.at, "kind": r.applied.fault.kind,
                            "slot": r.applied.fault.slot, "pid": r.applied.pid,
                            "affected": r.affected, "recovery": r.seconds,
                            "after_restart": r.after_restart}
                           for r in self.recoveries]}


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}s"


def _stored(backend_uri: str, prefix: str) -> list[Any]:
    backend = backends.fetch(backend_uri)
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            return [detail for book in conn.get_logbooks()
                    if book.name.startswith(f"{prefix}-") for detail in book]
    finally:
        backend.close()


def _failure_types(detail: Any, every: bool = False) -> set[str]:
    """The exception types of the flow's stored failures: the first of each (``every``: its
    bases too)."""
    found: set[str] = set()
    for atom in detail:
        failure = getattr(atom, "failure", None)
        if failure is not None and failure.exc_type_names:
            names = failure.exc_type_names if every else failure.exc_type_names[:1]
            found.update(name.rsplit(".", 1)[-1] for name in names)
    return found


def _reran_stored(detail: Any) -> list[str]:
    """Atoms whose stored attempts hold a completed execute after another, unreverted."""
    found = []
    for atom in detail:
        completed = False
        for attempt in (atom.meta or {}).get("attempt_log") or ():
            if attempt.get("action") == _DONE_EXECUTE and attempt.get("outcome") == states.SUCCESS:
                if completed:
                    found.append(f"flow {detail.uuid} atom {atom.name}: two completed "
                                 f"executes stored without a revert between them")
                completed = True
            elif attempt.get("action") == "revert":
                completed = False
    return found


def _undone(line: Mapping[str, Any], done: dict[str, float]) -> str | None:
    """Follow one engine log line in ``done`` (atom uuid -> when its execute was recorded
    done); return the atom's uuid if the line is an atom state change."""
    uuid = line.get("atom_uuid")
    if line["event"] != "atom" or not uuid:
        return None
    if line["state"] == states.SUCCESS:
        done.setdefault(uuid, line["t"])
    elif line["state"] in (states.REVERTING, states.REVERTED, states.PENDING):
        done.pop(uuid, None)  # undone: it may run again
    return str(uuid)


def _reran_logged(engine: Sequence[Mapping[str, Any]]) -> list[str]:
    """Atoms an engine started again after one had recorded them done, with no undo between."""
    done: dict[str, float] = {}
    found = []
    for line in engine:
        uuid = _undone(line, done)
        if uuid is not None and line["state"] == states.RUNNING and uuid in done:
            found.append(f"flow {line.get('flow')} atom {line.get('atom')}: started again by "
                         f"engine pid {line.get('pid')} {line['t'] - done[uuid]:.2f}s after "
                         f"it was recorded done")
    return found


def _recorded(engine: Sequence[Mapping[str, Any]], details: Sequence[Any]) -> set[str]:
    """The ids of every request some engine recorded (with its atom, before publishing it):
    as stored at the end, as each run found them stored when it started or resumed, and as
    they stood at each atom change an engine logged (a resumed run overwrites them)."""
    found: set[str] = set()
    for line in engine:
        for ids in (line.get("recorded") or {}).values():
            found.update(ids)
        found.update(line.get("ids") or ())
    for detail in details:
        for atom in detail:
            found.update(i for i in (atom.meta or {}).get("attempt_ids") or ()
                         if isinstance(i, str))
    return found


def _late(engine: Sequence[Mapping[str, Any]], workers: Sequence[Mapping[str, Any]],
          recorded: set[str]) -> tuple[list[str], list[str]]:
    """Requests a worker started after their atom had been recorded done: those some engine
    recorded sending (stale ones, sent before the atom completed), and those no engine
    recorded (sent by an engine that could no longer record its progress: a completed atom run
    again)."""
    done: dict[str, float] = {}
    for line in engine:
        _undone(line, done)
    stale, unrecorded = [], []
    for line in workers:
        if line["event"] != "task-started" or line.get("action") != _DONE_EXECUTE:
            continue
        when = done.get(str(line.get("atom_uuid")))
        if when is not None and line["t"] > when:
            said = (f"flow {line.get('flow_uuid')} atom {line.get('task_name')}: request "
                    f"{line.get('request_id')} (attempt {line.get('attempt')}) started on "
                    f"pid {line.get('pid')} {line['t'] - when:.2f}s after the atom was "
                    f"recorded done")
            if line.get("request_id") in recorded or not recorded:
                stale.append(said)
            else:
                unrecorded.append(f"{said}; no engine recorded sending it (one that could no "
                                  f"longer record its progress sent it)")
    return stale, unrecorded


def _unrecorded(workers: Sequence[Mapping[str, Any]], recorded: set[str]) -> int:
    """Requests workers started that no engine recorded sending."""
    if not recorded:  # nothing recorded at all: an engine log without ids (older sessions)
        return 0
    return len({line.get("request_id") for line in workers
                if line["event"] == "task-started" and line.get("request_id") not in recorded})


def _duplicates(workers: Sequence[Mapping[str, Any]]) -> int:
    finished: dict[str, int] = {}
    for line in workers:
        if line["event"] == "task-succeeded" and line.get("action") == _DONE_EXECUTE:
            key = str(line.get("atom_uuid"))
            finished[key] = finished.get(key, 0) + 1
    return sum(n - 1 for n in finished.values() if n > 1)


def _recovery(applied: Applied, engine: Sequence[Mapping[str, Any]],
              workers: Sequence[Mapping[str, Any]], restarts: Sequence[float]) -> Recovery:
    t = applied.t
    if applied.fault.kind == sc.RESTART_ENGINE:
        started = {ln["flow"]: ln["t"] for ln in engine
                   if ln["event"] in ("flow-start", "flow-resume") and ln["t"] <= t}
        ended = {ln["flow"] for ln in engine if ln["event"] == "flow-end" and ln["t"] <= t}
        hit = [flow for flow in started if flow not in ended]
        moved = [min((ln["t"] for ln in engine
                      if ln.get("flow") == flow and ln["t"] > t
                      and (ln["event"] == "flow-end"
                           or (ln["event"] == "atom" and ln["state"] in _MOVED_ON))),
                     default=None) for flow in hit]
    elif applied.fault.on_conductor:
        hit, moved = _conductor_hit(applied, engine)
    else:
        began = {ln["request_id"]: ln for ln in workers
                 if ln["event"] == "task-started" and ln["pid"] == applied.pid and ln["t"] <= t}
        over = {ln["request_id"] for ln in workers
                if ln["event"] in ("task-succeeded", "task-failed") and ln["t"] <= t}
        atoms = {str(ln.get("atom_uuid")) for rid, ln in began.items() if rid not in over}
        if not workers:  # TaskFlow's workers log nothing: every atom then in flight
            atoms = _in_flight(engine, t)
        hit = sorted(atoms)
        moved = [min((ln["t"] for ln in engine
                      if ln["event"] == "atom" and ln.get("atom_uuid") == atom and ln["t"] > t
                      and ln["state"] in _MOVED_ON), default=None) for atom in hit]
    if not hit:
        return Recovery(applied, 0, 0.0)
    if None in moved:
        return Recovery(applied, len(hit), None)
    last = max(m for m in moved if m is not None)
    rescued = (applied.fault.kind != sc.RESTART_ENGINE and not applied.fault.on_conductor
               and any(t < restart < last for restart in restarts))
    return Recovery(applied, len(hit), last - t, rescued)


def _conductor_hit(applied: Applied, log: Sequence[Mapping[str, Any]],
                   ) -> tuple[list[str], list[float | None]]:
    """The claims a conductor fault struck (those its process held then), and when each of
    their flows moved on: a step made under another claim (the conductor that took the job
    over), or the flow's end (under any claim: a conductor told to stop ends what it can)."""
    t, pid = applied.t, applied.pid
    held: dict[str, str] = {}  # claim -> flow
    for line in log:
        if line["t"] > t or line.get("pid") != pid:
            continue
        if line["event"] == "job-claimed":
            held[line["claim"]] = line["flow"]
        elif line["event"] == "job-released":
            held.pop(line["claim"], None)
    moved = []
    for claim, flow in held.items():
        moved.append(min((ln["t"] for ln in log if ln.get("flow") == flow and ln["t"] > t
                          and ((ln["event"] == "job-released" and ln["state"] in _ENDED)
                               or (ln["claim"] != claim and ln["event"] == "atom"
                                   and ln["state"] in _MOVED_ON))), default=None))
    return sorted(held), moved


def _in_flight(engine: Sequence[Mapping[str, Any]], t: float) -> set[str]:
    state: dict[str, str] = {}
    for line in engine:
        if line["event"] == "atom" and line["t"] <= t and line.get("atom_uuid"):
            state[line["atom_uuid"]] = line["state"]
    return {atom for atom, st in state.items() if st in (states.RUNNING, states.REVERTING)}


def _jobs(census: Sequence[jb.JobState], board: tuple[str, str],
          log: Sequence[Mapping[str, Any]]) -> Jobs:
    ended: dict[str, int] = {}
    left, trashed, lost, unrecorded, overwritten = [], [], [], [], []
    for job in census:
        shown = f"job {job.posted.name} ({job.posted.uuid})"
        outcome = job.ending
        if outcome in _GOOD_ENDINGS and job.flow_state != outcome:
            overwritten.append(f"{shown} ended {outcome}, yet its flow is stored "
                               f"{job.flow_state or 'nowhere'}: a write landed after it ended")
        if job.on_board:
            left.append(f"{shown} still on the board, "
                        + (f"claimed by {job.owner}" if job.owner else "unclaimed"))
        elif job.trashed is not None:
            trashed.append(f"{shown}: {job.trashed}")
        elif outcome is None and job.flow_state in _GOOD_ENDINGS:
            outcome = job.flow_state
            unrecorded.append(f"{shown} was consumed with its flow {job.flow_state}, and no "
                              f"conductor recorded its ending")
        elif outcome is None:
            lost.append(f"{shown} is gone from the board, no conductor recorded its ending, "
                        f"and its flow is {job.flow_state or 'gone'}")
        if outcome is not None:
            ended[outcome] = ended.get(outcome, 0) + 1
    halted = sum(1 for ln in log
                 if ln["event"] == "job-released" and ln.get("error") == "RunHalted")
    return Jobs(*board, len(census), ended, left, trashed, lost, halted, unrecorded,
                overwritten)


def certify(seed: int, replay: str, backend: str, prefix: str, engine_log: Path,
            workers_log: Path, applied: Iterable[Applied],
            jobs: Sequence[jb.JobState] | None = None,
            board: tuple[str, str] = ("", "")) -> Certificate:
    """Read everything a chaos run left and judge it.

    Args:
        seed, replay: What replays the run.
        backend: The store's URI.
        prefix: The logbooks of the run's flows are named ``<prefix>-<n>``.
        engine_log: The engine processes' log, or the conductors'.
        workers_log: The workers' log.
        applied: The faults applied.
        jobs: Where every job posted ended up (None: no jobboard).
        board: The board (its URI, the password left out) and where on it the jobs were.
    """
    engine = read_lines(engine_log)
    workers = read_lines(workers_log)
    details = _stored(backend, prefix)
    ended: dict[str, int] = {}
    hung, failed, lost, reran = [], [], [], []
    for detail in details:
        state = str(detail.state or states.PENDING)
        ended[state] = ended.get(state, 0) + 1
        if state == states.FAILURE:
            failed.append(f"flow {detail.uuid} ended FAILURE "
                          f"({', '.join(sorted(_failure_types(detail))) or '?'})")
        elif state not in (states.SUCCESS, states.REVERTED):
            stuck = [f"{a.name}={a.state}" for a in detail if a.state != states.SUCCESS]
            hung.append(f"flow {detail.uuid} still {state}: {', '.join(stuck) or 'not started'}")
        elif state == states.REVERTED and _failure_types(detail, every=True) & LOSS:
            lost.append(f"flow {detail.uuid} reverted after losing its work "
                        f"({', '.join(sorted(_failure_types(detail, every=True) & LOSS))})")
        reran += _reran_stored(detail)
    reran += _reran_logged(engine)
    recorded = _recorded(engine, details)
    late, unrecorded_late = _late(engine, workers, recorded)
    reran += unrecorded_late
    applied = list(applied)
    # What resends whatever a flow waits for: an engine restarted, a job resumed by another
    # conductor (or by the same one, claimed again).
    restarts = [a.t for a in applied
                if a.fault.kind == sc.RESTART_ENGINE or a.fault.on_conductor]
    recoveries = [_recovery(a, engine, workers, restarts) for a in applied]
    judged = None if jobs is None else _jobs(jobs, board, engine)
    return Certificate(seed, replay, len(details), ended, hung, failed, lost, reran,
                       _duplicates(workers), late, recoveries, judged,
                       _unrecorded(workers, recorded))
