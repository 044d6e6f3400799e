"""The certificate of a chaos run, from what was stored and logged.

Read: the stored flows (their final state, each atom's stored attempts and failure), the engine
processes' log (when each flow started, resumed and ended, every atom state change), the
workers' log (when each request started and finished, on which process; flowengine workers
only) and the faults applied. Judged:

- every flow ended SUCCESS or REVERTED (a flow still running when the chaos and its settling
  time were over *hung*; one that ended FAILURE failed);
- no completed atom ran again: once an engine recorded an atom's execute as done, no engine
  (the same one, or one that resumed the flow) started it again until it was reverted, and no
  atom's stored attempts hold two completed executes without a revert between them;
- every fault recovered: the work in flight where it struck (requests a killed or frozen worker
  held, flows a killed engine ran) moved on; a fault's recovery time is how long the slowest
  of them took to end (an atom's next state, the flow's next step).

Reverted flows whose failure was the loss of their work (``WorkerLost``, ``RequestTimeout``)
are counted apart: safe, yet the work was lost. Delivery is at-least-once, and the workers' log
shows what that cost: requests whose execute finished twice (a frozen worker's, thawed after
its lease lapsed and another worker ran it), and requests a worker started only after their
atom had completed elsewhere (a frozen worker thawed holding one it had taken but not started;
the engine had sent it before the atom completed, and ignores its outcome). Both are counted as
information: a task that must not repeat a side effect checks for it itself.
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
from flowengine.persistence import backends
from flowengine.testing.chaos import schedule as sc

#: Failures that mean the work was lost, not that the flow failed on its own.
LOSS = frozenset({"WorkerLost", "RequestTimeout"})
#: Atom states after which a piece of work in flight counts as moved on.
_MOVED_ON = frozenset({states.SUCCESS, states.FAILURE, states.REVERTED,
                       states.REVERT_FAILURE})
_DONE_EXECUTE = "execute"


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

    @property
    def hit(self) -> list[Recovery]:
        """The faults that struck work in flight."""
        return [r for r in self.recoveries if r.affected]

    @property
    def worst(self) -> float | None:
        """The slowest recovery (seconds), None if no fault hit work or one never recovered."""
        times = [r.seconds for r in self.hit]
        return None if not times or None in times else max(t for t in times if t is not None)

    @property
    def median(self) -> float | None:
        """The median recovery (seconds) of the faults that hit work and recovered."""
        times = [r.seconds for r in self.hit if r.seconds is not None]
        return statistics.median(times) if times else None

    @property
    def passed(self) -> bool:
        """Whether the flow is certified."""
        return (self.flows > 0 and not self.hung and not self.failed and not self.reran
                and all(r.recovered for r in self.recoveries))

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
            f"completed atoms run again: {len(self.reran)}",
            f"at-least-once: requests whose execute finished twice {self.duplicates}, "
            f"requests started after their atom completed elsewhere {len(self.late)}",
            f"flows reverted because their work was lost ({', '.join(sorted(LOSS))}): "
            f"{len(self.lost_work)}",
            f"worker faults recovered only after a later engine restart: "
            f"{sum(r.after_restart for r in self.recoveries)}",
        ]
        lines += [f"  HUNG: {h}" for h in self.hung]
        lines += [f"  FAILED: {f}" for f in self.failed]
        lines += [f"  RAN AGAIN: {r}" for r in self.reran]
        lines += [f"  LOST WORK: {w}" for w in self.lost_work]
        lines += [f"  started late: {w}" for w in self.late]
        lines += [f"  NOT RECOVERED: {r.applied.fault} (pid {r.applied.pid})"
                  for r in self.recoveries if not r.recovered]
        verdict = ("CERTIFIED: every flow ended SUCCESS or REVERTED, no completed atom ran "
                   "again, every fault recovered" if self.passed else "NOT CERTIFIED")
        lines += [f"seed: {self.seed} (replay: {self.replay})", verdict]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The certificate as JSON data."""
        return {"passed": self.passed, "seed": self.seed, "replay": self.replay,
                "flows": self.flows, "ended": self.ended, "hung": self.hung,
                "failed": self.failed, "lost_work": self.lost_work, "reran": self.reran,
                "duplicates": self.duplicates, "late": self.late,
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


def _late(engine: Sequence[Mapping[str, Any]],
          workers: Sequence[Mapping[str, Any]]) -> list[str]:
    """Requests a worker started after their atom had been recorded done (stale ones)."""
    done: dict[str, float] = {}
    for line in engine:
        _undone(line, done)
    found = []
    for line in workers:
        if line["event"] != "task-started" or line.get("action") != _DONE_EXECUTE:
            continue
        when = done.get(str(line.get("atom_uuid")))
        if when is not None and line["t"] > when:
            found.append(f"flow {line.get('flow_uuid')} atom {line.get('task_name')}: request "
                         f"{line.get('request_id')} (attempt {line.get('attempt')}) started on "
                         f"pid {line.get('pid')} {line['t'] - when:.2f}s after the atom was "
                         f"recorded done")
    return found


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
    rescued = (applied.fault.kind != sc.RESTART_ENGINE
               and any(t < restart < last for restart in restarts))
    return Recovery(applied, len(hit), last - t, rescued)


def _in_flight(engine: Sequence[Mapping[str, Any]], t: float) -> set[str]:
    state: dict[str, str] = {}
    for line in engine:
        if line["event"] == "atom" and line["t"] <= t and line.get("atom_uuid"):
            state[line["atom_uuid"]] = line["state"]
    return {atom for atom, st in state.items() if st in (states.RUNNING, states.REVERTING)}


def certify(seed: int, replay: str, backend: str, prefix: str, engine_log: Path,
            workers_log: Path, applied: Iterable[Applied]) -> Certificate:
    """Read everything a chaos run left and judge it."""
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
    applied = list(applied)
    restarts = [a.t for a in applied if a.fault.kind == sc.RESTART_ENGINE]
    recoveries = [_recovery(a, engine, workers, restarts) for a in applied]
    return Certificate(seed, replay, len(details), ended, hung, failed, lost, reran,
                       _duplicates(workers), _late(engine, workers), recoveries)
