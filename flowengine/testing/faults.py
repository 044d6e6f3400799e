"""Faults a test injects into task calls, and the interceptor that injects them and keeps
the ledger.

A :class:`Fault` names a call by atom, action and attempt (the Nth call of that atom's
``execute`` or ``revert`` in the run) and says what happens to it: it fails before the task's
code runs (:func:`fail_execute`, :func:`fail_revert`), a revert is made twice
(:func:`revert_twice`), or the worker running it is lost, before the task's code runs or after
(:func:`lose_worker`). :class:`Recorder` is the interceptor
(:class:`~flowengine.engines.interception.Interceptor`) that applies them and writes every
call to the ledger.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from flowengine.engines import interception
from flowengine.testing import effects
from flowengine.testing import ledger as lg
from flowengine.types.failure import Failure

FAIL = "fail"
TWICE = "twice"
LOSE = "lose"
_KINDS = (FAIL, TWICE, LOSE)
_ACTIONS = (interception.EXECUTE, interception.REVERT)


class InjectedFault(Exception):
    """What a task call raises, instead of running, when a test told the kit to fail it."""


class WorkerGone(BaseException):
    """Ends the thread of a call whose worker the kit lost, once the kit closes (never seen by
    a task: the worker's connections are dead, so nothing it does reaches the engine)."""


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault to inject.

    Attributes:
        kind: :data:`FAIL`, :data:`TWICE` or :data:`LOSE`.
        action: ``execute`` or ``revert``.
        atom: The atom whose calls it hits (None: every atom's).
        attempt: Which call of that atom's action in the run, 1 first (None: every one).
        after_effects: For :data:`LOSE`: the worker is lost after the task's code ran (its
            effects happened, its outcome never arrives), not before.
    """

    kind: str
    action: str
    atom: str | None = None
    attempt: int | None = None
    after_effects: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(_KINDS)}")
        if self.action not in _ACTIONS:
            raise ValueError(f"fault action {self.action!r} is not execute or revert")
        if self.attempt is not None and self.attempt < 1:
            raise ValueError(f"fault attempt must be 1 or more, not {self.attempt}")
        if self.kind == TWICE and self.action != interception.REVERT:
            raise ValueError("only a revert can be made twice")

    def matches(self, atom: str, action: str, attempt: int) -> bool:
        """Whether the call ``attempt`` of ``atom``'s ``action`` is hit."""
        return (action == self.action and self.atom in (None, atom)
                and self.attempt in (None, attempt))

    def __str__(self) -> str:
        which = self.atom or "every atom"
        when = "every attempt" if self.attempt is None else f"attempt {self.attempt}"
        if self.kind == FAIL:
            return f"fail {self.action} of {which} ({when})"
        if self.kind == TWICE:
            return f"revert {which} twice ({when})"
        moment = "after" if self.after_effects else "before"
        return f"lose the worker of {which}'s {self.action}, {moment} it runs ({when})"

    def to_dict(self) -> dict[str, Any]:
        """The fault as JSON data (``flowengine rehearse`` hands faults to worker processes)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        """The fault :meth:`to_dict` gave."""
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def fail_execute(atom: str, attempt: int | None = None) -> Fault:
    """``atom``'s execute raises :class:`InjectedFault` instead of running (on ``attempt``,
    default every attempt)."""
    return Fault(FAIL, interception.EXECUTE, atom, attempt)


def fail_revert(atom: str, attempt: int | None = None) -> Fault:
    """``atom``'s revert raises :class:`InjectedFault` instead of running."""
    return Fault(FAIL, interception.REVERT, atom, attempt)


def revert_twice(atom: str | None = None) -> Fault:
    """``atom``'s revert (every atom's if None) is made twice in a row; the second call's
    outcome is the call's."""
    return Fault(TWICE, interception.REVERT, atom)


def lose_worker(atom: str, attempt: int | None = 1, after_effects: bool = False,
                action: str = interception.EXECUTE) -> Fault:
    """The worker running ``atom``'s ``action`` (on ``attempt``, default the first) is lost,
    before the task's code runs or, with ``after_effects``, after it (worker-based only)."""
    return Fault(LOSE, action, atom, attempt, after_effects)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The faults in force and the run they belong to (the run names the ledger lines)."""

    run: str | None
    faults: Sequence[Fault] = ()


class Hooks:
    """What the recorder asks of whoever runs it (the test kit): where a call runs, how to
    lose its worker; and what it tells it (a call ended). The defaults suit a process without
    workers to lose."""

    def worker(self) -> str | None:
        """The worker running the current call (None: no worker, a local engine)."""
        return None

    def lose(self, worker: str | None, atom: str) -> None:
        """Lose ``worker`` now (raise if that cannot be done here)."""
        raise RuntimeError(f"cannot lose the worker running {atom!r}: the task runs in the "
                           f"engine's process (lose_worker needs the worker-based engine)")

    def lost(self, worker: str | None) -> bool:
        """Whether ``worker`` was lost."""
        return False

    def hold(self) -> None:
        """Block the lost worker's thread until the kit closes (a dead process does nothing)."""

    def ended(self, atom: str) -> None:
        """A call of ``atom`` ended (its outcome is on its way to the engine)."""


class Recorder(interception.Interceptor):
    """Writes every task call to a ledger and applies the faults of the plan in force.

    Args:
        ledger: Where calls go.
        plan: Gives the plan in force at each call.
        hooks: Where calls run and how to lose their workers (default: nowhere, no way).
    """

    def __init__(self, ledger: lg.Ledger, plan: Callable[[], Plan],
                 hooks: Hooks | None = None) -> None:
        self.ledger, self._plan, self._hooks = ledger, plan, hooks or Hooks()
        self._attempts: dict[tuple[str | None, str, str], int] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._active = 0
        self._idle = threading.Condition(self._lock)

    @property
    def active(self) -> int:
        """Task calls in progress in this process."""
        with self._lock:
            return self._active

    def wait_idle(self, timeout: float) -> bool:
        """Block until no task call is in progress here; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def around(self, call: interception.TaskCall, proceed: Callable[[], Any]) -> Any:
        step = self._begin(call)
        try:
            result = step.run(proceed, repeat=False)
            if step.twice is not None:
                result = step.run(proceed, repeat=True)
            return result
        finally:
            step.done()

    async def around_async(self, call: interception.TaskCall,
                           proceed: Callable[[], Awaitable[Any]]) -> Any:
        step = self._begin(call)
        try:
            result = await step.run_async(proceed, repeat=False)
            if step.twice is not None:
                result = await step.run_async(proceed, repeat=True)
            return result
        finally:
            step.done()

    def _begin(self, call: interception.TaskCall) -> _Step:
        atom, action = str(call.task.name), call.action
        plan = self._plan()
        with self._lock:
            key = (plan.run, atom, action)
            attempt = self._attempts[key] = self._attempts.get(key, 0) + 1
            self._active += 1
        step = _Step(self, plan, atom, action, attempt, call.arguments)
        try:
            step.start()
        except BaseException:
            step.done()
            raise
        return step

    def _not_active(self, atom: str, held: bool) -> None:
        with self._lock:
            self._active -= 1
            self._idle.notify_all()
        if not held:
            self._hooks.ended(atom)

    def next_call_id(self) -> str:
        """A call id unique among every process writing the ledger."""
        return f"{os.getpid()}-{id(self):x}-{next(self._ids)}"


class _Step:
    """One intercepted call: its faults, its ledger lines and its effects' context."""

    def __init__(self, recorder: Recorder, plan: Plan, atom: str, action: str, attempt: int,
                 arguments: Mapping[str, Any]) -> None:
        self.recorder, self.plan = recorder, plan
        self.atom, self.action, self.attempt = atom, action, attempt
        hits = [f for f in plan.faults if f.matches(atom, action, attempt)]
        self.fail = _first(hits, FAIL)
        self.twice = _first(hits, TWICE)
        self.lose = _first(hits, LOSE)
        self.after_failure = (action == interception.REVERT
                              and isinstance(arguments.get("result"), Failure))
        self.worker = recorder._hooks.worker()
        self._call: str | None = None
        self._token: Any = None
        self._done = False

    @property
    def _base(self) -> dict[str, Any]:
        return {"atom": self.atom, "action": self.action, "attempt": self.attempt,
                "run": self.plan.run, "worker": self.worker}

    def start(self) -> None:
        """Apply the faults that come before the task's code; open the first call."""
        ledger = self.recorder.ledger
        if self.fail is not None:
            ledger.append(lg.FAULT, outcome=lg.FAILED, error=str(self.fail), **self._base)
            raise InjectedFault(f"{self.action} of {self.atom} failed on purpose (attempt "
                                f"{self.attempt})")
        if self.lose is not None and not self.lose.after_effects:
            ledger.append(lg.FAULT, outcome=lg.LOST, error=str(self.lose), **self._base)
            self._lose()
        self._open(repeat=False)

    def _open(self, repeat: bool) -> None:
        self._call = self.recorder.next_call_id()
        self.recorder.ledger.append(lg.CALL, call=self._call, repeat=repeat,
                                    after_failure=self.after_failure, **self._base)
        self._token = effects.entering(effects.CallContext(
            self.atom, self.action, self.attempt, self._call, self.plan.run, self.worker))

    def run(self, proceed: Callable[[], Any], repeat: bool) -> Any:
        """Make the call (its repeat, with ``repeat``) and close it in the ledger."""
        if repeat:
            self._open(repeat=True)
        try:
            result = proceed()
        except Exception as err:
            self._close(lg.RAISED, f"{type(err).__name__}: {err}", repeat)
            raise
        self._returned(result, repeat)
        return result

    async def run_async(self, proceed: Callable[[], Awaitable[Any]], repeat: bool) -> Any:
        """:meth:`run` for an ``async def`` method."""
        if repeat:
            self._open(repeat=True)
        try:
            result = await proceed()
        except Exception as err:
            self._close(lg.RAISED, f"{type(err).__name__}: {err}", repeat)
            raise
        self._returned(result, repeat)
        return result

    def _returned(self, result: Any, repeat: bool) -> None:
        if isinstance(result, Failure):  # an outcome given as data stands for a raise
            self._close(lg.RAISED, result.exception_str, repeat)
        else:
            self._close(lg.RETURNED, None, repeat)

    def _close(self, outcome: str, error: str | None, repeat: bool) -> None:
        if self._token is not None:
            effects.leaving(self._token)
            self._token = None
        ledger, hooks = self.recorder.ledger, self.recorder._hooks
        if self.lose is not None and self.lose.after_effects:
            ledger.append(lg.RETURN, outcome=lg.LOST, call=self._call, repeat=repeat,
                          **self._base)
            ledger.append(lg.FAULT, outcome=lg.LOST, error=str(self.lose), **self._base)
            self._lose()
        if hooks.lost(self.worker):
            # Its worker was lost meanwhile (another call's fault): this outcome goes nowhere.
            ledger.append(lg.RETURN, outcome=lg.LOST, call=self._call, repeat=repeat,
                          **self._base)
            self._hold()
        ledger.append(lg.RETURN, outcome=outcome, error=error, call=self._call, repeat=repeat,
                      **self._base)

    def _lose(self) -> None:
        self.recorder._hooks.lose(self.worker, self.atom)
        self._hold()

    def _hold(self) -> None:
        # A dead worker's call is no longer in progress: time may be skipped past it.
        self.done(held=True)
        self.recorder._hooks.hold()
        raise WorkerGone(self.worker)

    def done(self, held: bool = False) -> None:
        """The call is over (``held``: its worker is dead): no longer in progress (once)."""
        if not self._done:
            self._done = True
            self.recorder._not_active(self.atom, held)


def _first(faults: Iterable[Fault], kind: str) -> Fault | None:
    return next((f for f in faults if f.kind == kind), None)
