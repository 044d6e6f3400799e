"""A flow's history as a timeline: a row per atom, a bar per attempt (Temporal's manner).

Two sources make the bars. Events the dashboard heard while the flow ran give each attempt its
own bar: queued (``task-sent``) then running on a worker, ending in its outcome, a lost attempt
ending ``LOST``; a retry controller's wait before an attempt (``task-delayed`` until
``task-delay-ended``) is a ``wait`` bar. The stored times (when each atom entered each state,
which every engine records: see :mod:`flowengine.persistence.state_times`) give one execute bar
and one revert bar per atom, with the attempts the engine logged named on it; they are what a
page opened after the run (or a dashboard started after it) can show.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flowengine.cli import formatting as fmt

_ENDS = {"task-succeeded": "SUCCESS", "task-failed": "FAILURE", "task-reverted": "REVERTED",
         "task-revert-failed": "REVERT_FAILURE", "task-lost": "LOST"}
_EXECUTE_ENDS = ("SUCCESS", "FAILURE")
_REVERT_ENDS = ("REVERTED", "REVERT_FAILURE")


@dataclasses.dataclass
class Bar:
    """One attempt: ``queued`` (may be None) to ``start`` to ``end`` (None: still going)."""

    action: str
    start: float
    end: float | None = None
    queued: float | None = None
    outcome: str | None = None
    worker: str | None = None
    attempt: int | None = None
    note: str = ""


@dataclasses.dataclass
class Row:
    """An atom's bars, in time order."""

    name: str
    bars: list[Bar]


@dataclasses.dataclass(frozen=True)
class Placed:
    """A bar in percent of the timeline's width."""

    bar: Bar
    left: float
    width: float
    queued_width: float


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Rows of bars between ``start`` and ``end`` (UNIX seconds)."""

    rows: list[Row]
    start: float
    end: float

    @property
    def span(self) -> float:
        """Seconds the timeline covers."""
        return self.end - self.start

    def place(self, bar: Bar) -> Placed:
        """Where ``bar`` is drawn."""
        span = self.span or 1.0
        begin = bar.queued if bar.queued is not None else bar.start
        end = bar.end if bar.end is not None else self.end
        left = (begin - self.start) / span * 100
        return Placed(bar, left, max((end - begin) / span * 100, 0.4),
                      (bar.start - begin) / span * 100)


def from_events(events: Iterable[Mapping[str, Any]]) -> dict[str, Row]:
    """Rows by atom uuid from a flow's ``task-*`` events."""
    rows: dict[str, Row] = {}
    for event in sorted(events, key=lambda e: float(e.get("timestamp") or 0.0)):
        atom, kind = event.get("atom_uuid"), str(event.get("type", ""))
        stamp = event.get("timestamp")
        if not isinstance(atom, str) or not isinstance(stamp, (int, float)):
            continue
        row = rows.setdefault(atom, Row(str(event.get("task_name", "?")), []))
        action = str(event.get("action") or "execute")
        attempt = event.get("attempt") if isinstance(event.get("attempt"), int) else None
        worker = event.get("worker") if isinstance(event.get("worker"), str) else None
        if _waited(row, kind, event, float(stamp), attempt):
            continue
        bar = _open_bar(row, action, attempt)
        if kind == "task-sent" or (kind == "task-started" and bar is None):
            bar = Bar(action, float(stamp), attempt=attempt, worker=worker)
            if kind == "task-sent":
                bar.queued = float(stamp)
            row.bars.append(bar)
        if bar is None:
            continue
        if kind == "task-started":
            bar.start = float(stamp)
        if worker and kind in ("task-started", "task-moved", "task-sent"):
            bar.worker = worker
        if kind in _ENDS:
            bar.end, bar.outcome = float(stamp), _ENDS[kind]
            bar.note = str(event.get("reason") or event.get("exc_type") or "")
    return rows


def _waited(row: Row, kind: str, event: Mapping[str, Any], stamp: float,
            attempt: int | None) -> bool:
    """A retry controller's wait before an attempt (``task-delayed`` to ``task-delay-ended``)
    as a ``wait`` bar; False for any other event."""
    if kind == "task-delayed":
        due = event.get("due")
        until = fmt.timestamp(float(due)) if isinstance(due, int | float) else None
        row.bars.append(Bar("wait", stamp, attempt=attempt, note=f"until {until}" if until else ""))
        return True
    if kind == "task-delay-ended":
        bar = _open_bar(row, "wait", attempt)
        if bar is not None:
            bar.end, bar.outcome = stamp, "WAITED"
        return True
    return False


def _open_bar(row: Row, action: str, attempt: int | None) -> Bar | None:
    for bar in reversed(row.bars):
        if bar.action == action and bar.end is None and (
                attempt is None or bar.attempt in (None, attempt)):
            return bar
    return None


def from_records(atoms: Iterable[Mapping[str, Any]]) -> dict[str, Row]:
    """Rows by atom uuid from stored atom records (see ``cli.records.atom_record``: ``times``
    is when the atom last entered each state)."""
    rows: dict[str, Row] = {}
    for atom in atoms:
        stamps: Mapping[str, float] = atom.get("times") or {}
        log = [a for a in atom.get("attempt_log") or () if isinstance(a, Mapping)]
        bars = []
        for action, begin, ends in (("execute", "RUNNING", _EXECUTE_ENDS),
                                    ("revert", "REVERTING", _REVERT_ENDS)):
            if begin not in stamps:
                continue
            tried = [a for a in log if (a.get("action") or "execute") == action]
            end = max((stamps[e] for e in ends if e in stamps and stamps[e] >= stamps[begin]),
                      default=None)
            outcome = next((e for e in ends if stamps.get(e) == end), None) if end else None
            last = tried[-1] if tried else {}
            lost = [a for a in tried if a.get("outcome") == "LOST"]
            note = ", ".join(f"attempt {a.get('attempt')} lost on {a.get('worker') or '?'}"
                             for a in lost)
            bars.append(Bar(action, float(stamps[begin]), end, outcome=outcome,
                            worker=last.get("worker"), attempt=last.get("attempt"), note=note))
        if bars:
            rows[str(atom["uuid"])] = Row(str(atom["name"]), bars)
    return rows


def build(atoms: Sequence[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
          now: float) -> Timeline | None:
    """The timeline of a flow: heard events where there are, stored timestamps elsewhere, in
    the order of ``atoms``; None when neither says when anything ran."""
    heard, stored = from_events(events), from_records(atoms)
    rows = [heard.get(str(a["uuid"])) or stored.get(str(a["uuid"])) for a in atoms]
    rows += [row for uuid, row in heard.items() if uuid not in {str(a["uuid"]) for a in atoms}]
    present = [row for row in rows if row is not None and row.bars]
    if not present:
        return None
    bars = [bar for row in present for bar in row.bars]
    start = min(b.queued if b.queued is not None else b.start for b in bars)
    running = any(b.end is None for b in bars)
    end = max([now] if running else [b.end for b in bars if b.end is not None])
    return Timeline(present, start, max(end, start + 0.001))
