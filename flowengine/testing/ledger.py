"""The ledger: every task call and side effect of a test, in the order they happened.

The kit's interceptor (:mod:`.faults`) writes a :data:`CALL` line when a task's ``execute`` or
``revert`` starts, a :data:`RETURN` line when it ends, and a :data:`FAULT` line where the kit
failed a call or lost its worker instead; the side-effect API tasks call (:mod:`.effects`)
writes an :data:`EFFECT` line for each change of the observed world, with the value before and
after. Assertions read it (:class:`Ledger` methods such as :meth:`~Ledger.assert_ran_once`), and
so do ``flowengine rehearse`` and ``flowengine chaos``.

:class:`MemoryLedger` serves one process (the test kit's in-process workers share it);
:class:`FileLedger` is a JSON-lines file several processes append to under a lock (worker
processes of ``flowengine rehearse``).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flowengine.testing import judge

#: A task's method started (its own code runs from here).
CALL = "call"
#: It ended: ``outcome`` is :data:`RETURNED`, :data:`RAISED` or :data:`LOST`.
RETURN = "return"
#: The kit failed the call (``outcome`` :data:`FAILED`) or lost its worker (:data:`LOST`).
FAULT = "fault"
#: A change of the observed world (``op``: put, delete, add) or a note.
EFFECT = "effect"
#: The observed world starts afresh: every key is gone (a rehearsal's runs are independent).
RESET = "reset"

RETURNED = "returned"
RAISED = "raised"
FAILED = "failed"
LOST = "lost"

#: A value changes in the observed world; ``compute`` gets the value before, returns the one after.
Compute = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line of the ledger.

    Attributes:
        seq: Its place in the ledger (0 first).
        kind: :data:`CALL`, :data:`RETURN`, :data:`FAULT` or :data:`EFFECT`.
        atom: The atom (task name) it concerns, if any.
        action: ``execute`` or ``revert``.
        attempt: Which call of the atom's action it is in its run (1 first).
        call: The id of the call; an effect names the call it happened in.
        run: The run it belongs to (the kit numbers its runs; rehearse names them).
        outcome: How a call ended, or which fault this is.
        error: What a call raised (type and message), or why a fault happened.
        repeat: A revert made a second time by the kit (``revert_twice``).
        after_failure: A revert whose ``result`` is a failure: its execute never completed.
        op: An effect's operation (``put``, ``delete``, ``add``, ``note``).
        key: An effect's key in the observed world.
        before: The key's value before the effect (None: absent).
        after: Its value after.
        details: Anything else the writer gave (a note's fields).
        worker: Where it happened (a kit worker's name, or ``host:pid``).
        t: When (seconds since the epoch, real time).
    """

    seq: int
    kind: str
    atom: str | None = None
    action: str | None = None
    attempt: int | None = None
    call: str | None = None
    run: str | None = None
    outcome: str | None = None
    error: str | None = None
    repeat: bool = False
    after_failure: bool = False
    op: str | None = None
    key: str | None = None
    before: Any = None
    after: Any = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    worker: str | None = None
    t: float = 0.0

    @property
    def changed(self) -> bool:
        """Whether this is an effect that left its key with another value than before."""
        return self.kind == EFFECT and self.op != "note" and self.before != self.after

    def to_json(self) -> str:
        """One JSON line (values JSON cannot hold are written as their ``repr``)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)
                    if f.name not in _ALWAYS_WRITTEN}
        fields = {k: v for k, v in dataclasses.asdict(self).items()
                  if not (k in defaults and v is defaults[k]) and v != {}}
        return json.dumps(fields, default=repr, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Entry:
        """The entry :meth:`to_json` wrote."""
        fields = json.loads(line)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in known})


#: Fields a JSON line always holds (a value equal to a default, such as ``0``, is data).
_ALWAYS_WRITTEN = frozenset({"seq", "kind", "before", "after"})


def _fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    found = dict(fields)
    found.setdefault("t", time.time())
    return found


class Ledger(abc.ABC):
    """What happened, in order: queries and assertions over it (see the module docstring)."""

    @abc.abstractmethod
    def append(self, kind: str, **fields: Any) -> Entry:
        """Add a line (its ``seq`` is given here); return it."""

    @abc.abstractmethod
    def change(self, key: str, op: str, compute: Compute, **fields: Any) -> Entry:
        """Change ``key`` in the observed world atomically: ``compute`` gets its value before
        (None if absent) and returns the value after (None: absent); return the effect line."""

    @abc.abstractmethod
    def entries(self, run: str | None = None) -> list[Entry]:
        """Every line (of ``run`` only, if given), oldest first."""

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """The observed world now: every key that holds a value."""

    # -- queries --------------------------------------------------------------------------

    def calls(self, atom: str | None = None, action: str | None = None,
              run: str | None = None, repeats: bool = True) -> list[Entry]:
        """The calls that started (their own code ran), oldest first.

        Args:
            atom: Only this atom's.
            action: Only ``execute`` or only ``revert`` calls.
            run: Only this run's.
            repeats: Whether reverts the kit made a second time count.
        """
        return [e for e in self.entries(run) if e.kind == CALL
                and (atom is None or e.atom == atom) and (action is None or e.action == action)
                and (repeats or not e.repeat)]

    def effects(self, key: str | None = None, run: str | None = None) -> list[Entry]:
        """The effects (and notes), of ``key`` only if given, oldest first."""
        return [e for e in self.entries(run)
                if e.kind == EFFECT and (key is None or e.key == key)]

    def faults(self, run: str | None = None) -> list[Entry]:
        """The faults the kit injected, oldest first."""
        return [e for e in self.entries(run) if e.kind == FAULT]

    def reset_world(self, run: str | None = None) -> Entry:
        """Start the observed world afresh (every key gone) from this line on."""
        return self.append(RESET, run=run)

    def last_run(self) -> str | None:
        """The run of the newest line (None: the ledger is empty)."""
        found = self.entries()
        return found[-1].run if found else None

    def dump(self, run: str | None = None) -> str:
        """The lines as text, one a line (for assertion messages)."""
        return "\n".join(_describe(e) for e in self.entries(run)) or "(the ledger is empty)"

    # -- assertions -----------------------------------------------------------------------

    def assert_ran(self, atom: str, times: int, run: str | None = None) -> None:
        """``atom``'s ``execute`` ran ``times`` times (its own code started that often)."""
        ran = self.calls(atom, "execute", run)
        if len(ran) != times:
            raise AssertionError(
                f"{atom} executed {len(ran)} time(s), not {times}\n{self.dump(run)}")

    def assert_ran_once(self, atom: str, run: str | None = None) -> None:
        """``atom``'s ``execute`` ran exactly once."""
        self.assert_ran(atom, 1, run)

    def assert_not_ran(self, atom: str, run: str | None = None) -> None:
        """``atom``'s ``execute`` never ran."""
        self.assert_ran(atom, 0, run)

    def assert_reverted_in_order(self, *atoms: str, run: str | None = None) -> None:
        """Exactly these atoms were reverted, each once, in this order (repeats the kit made
        with ``revert_twice`` aside)."""
        reverted = [e.atom for e in self.calls(action="revert", run=run, repeats=False)]
        if reverted != list(atoms):
            raise AssertionError(
                f"reverted {reverted}, expected {list(atoms)} in this order\n{self.dump(run)}")

    def assert_not_reverted(self, atom: str, run: str | None = None) -> None:
        """``atom``'s ``revert`` never ran."""
        reverted = self.calls(atom, "revert", run)
        if reverted:
            raise AssertionError(f"{atom} was reverted {len(reverted)} time(s)\n"
                                 f"{self.dump(run)}")

    def assert_changed_once(self, key: str, run: str | None = None) -> None:
        """``key`` of the observed world changed exactly once (the effect applied once, however
        often the code around it ran)."""
        changes = [e for e in self.effects(key, run) if e.changed]
        if len(changes) != 1:
            raise AssertionError(f"{key} changed {len(changes)} time(s), not once\n"
                                 f"{self.dump(run)}")

    def assert_compensated(self, run: str | None = None,
                           dependencies: judge.Dependencies = (),
                           tolerant: frozenset[str] = frozenset()) -> None:
        """The compensation of ``run`` (default: the last) holds: every completed execute
        reverted once, dependants before what they depend on, no revert of an atom that never
        ran, nothing changed by a revert whose execute never completed, repeated reverts
        idempotent. See :func:`flowengine.testing.judge.compensation`.

        Args:
            run: The run to judge.
            dependencies: ``(earlier, later)`` atom pairs where ``later`` depends on
                ``earlier`` (so is reverted first); ``TestKit.dependencies(flow)`` gives them.
            tolerant: Atoms whose revert may run without their execute, and change things.
        """
        run = run if run is not None else self.last_run()
        findings = judge.compensation(self.entries(run), dependencies, tolerant)
        if findings:
            listed = "\n".join(f"- {f}" for f in findings)
            raise AssertionError(f"compensation of run {run} does not hold:\n{listed}\n"
                                 f"{self.dump(run)}")


def _describe(entry: Entry) -> str:
    where = f"#{entry.seq} run {entry.run}" if entry.run is not None else f"#{entry.seq}"
    if entry.kind == RESET:
        return f"{where} the observed world starts afresh"
    if entry.kind == EFFECT:
        change = (f"{entry.op} {entry.key}: {entry.before!r} -> {entry.after!r}"
                  if entry.op != "note" else f"note {dict(entry.details)}")
        return f"{where} {entry.atom or '-'}.{entry.action or '-'}: {change}"
    extra = " (repeat)" if entry.repeat else ""
    extra += " (after a failed execute)" if entry.after_failure else ""
    tail = f" {entry.outcome}" if entry.outcome else ""
    tail += f": {entry.error}" if entry.error else ""
    return (f"{where} {entry.kind} {entry.atom}.{entry.action} attempt {entry.attempt}"
            f"{extra}{tail}" + (f" on {entry.worker}" if entry.worker else ""))


def _apply(state: dict[str, Any], entry: Entry) -> None:
    if entry.kind == RESET:
        state.clear()
        return
    if entry.kind != EFFECT or entry.op == "note" or entry.key is None:
        return
    if entry.after is None:
        state.pop(entry.key, None)
    else:
        state[entry.key] = entry.after


class MemoryLedger(Ledger):
    """A ledger kept in this process's memory (thread-safe)."""

    def __init__(self) -> None:
        self._lines: list[Entry] = []
        self._state: dict[str, Any] = {}
        self._lock = threading.Condition()

    def append(self, kind: str, **fields: Any) -> Entry:
        with self._lock:
            entry = Entry(seq=len(self._lines), kind=kind, **_fields(fields))
            self._lines.append(entry)
            _apply(self._state, entry)
            self._lock.notify_all()
            return entry

    def change(self, key: str, op: str, compute: Compute, **fields: Any) -> Entry:
        with self._lock:
            before = self._state.get(key)
            entry = Entry(seq=len(self._lines), kind=EFFECT, op=op, key=key, before=before,
                          after=compute(before), **_fields(fields))
            self._lines.append(entry)
            _apply(self._state, entry)
            self._lock.notify_all()
            return entry

    def wait_for(self, predicate: Callable[[list[Entry]], bool], timeout: float) -> bool:
        """Block until ``predicate`` holds for the lines (checked at each new line); False if
        it does not within ``timeout`` seconds."""
        with self._lock:
            return self._lock.wait_for(lambda: predicate(self._lines), timeout)

    def wait_for_call(self, atom: str, action: str = "execute", timeout: float = 30.0) -> Entry:
        """The first call of ``atom``'s ``action``, once it started.

        Raises:
            AssertionError: It did not start within ``timeout`` seconds.
        """
        def started(lines: list[Entry]) -> bool:
            return any(e.kind == CALL and e.atom == atom and e.action == action for e in lines)

        if not self.wait_for(started, timeout):
            raise AssertionError(f"{atom}'s {action} did not start within {timeout}s\n"
                                 f"{self.dump()}")
        return self.calls(atom, action)[0]

    def entries(self, run: str | None = None) -> list[Entry]:
        with self._lock:
            lines = list(self._lines)
        return lines if run is None else [e for e in lines if e.run == run]

    def state(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)


class FileLedger(Ledger):
    """A JSON-lines file that processes append to under an exclusive ``flock``.

    Each process keeps what it read so far and reads only what was added since; a change reads
    up to date under the lock before it computes, so a key's ``before`` is the world's value
    whichever process changed it last.

    Args:
        path: The file (created if missing).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lines: list[Entry] = []
        self._state: dict[str, Any] = {}
        self._offset = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[Any]:
        with self._lock, open(self.path, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                self._catch_up(handle)
                yield handle
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _catch_up(self, handle: Any) -> None:
        handle.seek(self._offset)
        added = handle.read()
        if not added:
            return
        complete, _, _partial = added.rpartition(b"\n")  # a line is written whole, under lock
        for line in complete.split(b"\n"):
            if line.strip():
                entry = Entry.from_json(line.decode("utf-8"))
                self._lines.append(entry)
                _apply(self._state, entry)
        self._offset += len(complete) + 1

    def _write(self, handle: Any, entry: Entry) -> Entry:
        data = (entry.to_json() + "\n").encode("utf-8")
        handle.seek(0, os.SEEK_END)
        handle.write(data)
        handle.flush()
        self._offset += len(data)
        self._lines.append(entry)
        _apply(self._state, entry)
        return entry

    def append(self, kind: str, **fields: Any) -> Entry:
        with self._locked(exclusive=True) as handle:
            return self._write(handle, Entry(seq=len(self._lines), kind=kind, **_fields(fields)))

    def change(self, key: str, op: str, compute: Compute, **fields: Any) -> Entry:
        with self._locked(exclusive=True) as handle:
            before = self._state.get(key)
            # A round trip through JSON, so "before" here and as read back elsewhere agree.
            after = json.loads(json.dumps(compute(before), default=repr))
            return self._write(handle, Entry(seq=len(self._lines), kind=EFFECT, op=op, key=key,
                                             before=before, after=after, **_fields(fields)))

    def entries(self, run: str | None = None) -> list[Entry]:
        with self._locked(exclusive=False):
            lines = list(self._lines)
        return lines if run is None else [e for e in lines if e.run == run]

    def state(self) -> dict[str, Any]:
        with self._locked(exclusive=False):
            return dict(self._state)
