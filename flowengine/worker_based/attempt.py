"""One request attempt's lifecycle: a frozen state machine driven by events and a clock.

An attempt is created WAITING (no worker yet), is DISPATCHED to a worker's topic (PENDING),
RUNNING once a worker says it started it (it then holds a lease that heartbeats renew), and ends
exactly once: FINISHED (its outcome arrived), LAPSED (its lease ran out or its worker was lost),
TIMED_OUT (it waited past its transition timeout, or ran past its time limit), HANDED_BACK (a
worker returned it unrun), PASSED_OVER (nobody took it from its topic's queue in time, so it
was revoked and sent elsewhere) or CANCELLED (revoked before it ran). Time is read only from the
injected clock, so every expiry is tested by moving a clock, without a broker.

:meth:`Attempt.judge` says which event the clock makes due; the executor applies it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from automaton import machines

WAITING = "WAITING"
PENDING = "PENDING"
RUNNING = "RUNNING"
FINISHED = "FINISHED"
LAPSED = "LAPSED"
TIMED_OUT = "TIMED_OUT"
HANDED_BACK = "HANDED_BACK"
PASSED_OVER = "PASSED_OVER"
CANCELLED = "CANCELLED"

DISPATCH = "dispatch"
START = "start"
RENEW = "renew"
FINISH = "finish"
LAPSE = "lapse"
TIME_OUT = "time_out"
HAND_BACK = "hand_back"
PASS_OVER = "pass_over"
CANCEL = "cancel"

#: States an attempt ends in.
ENDED = frozenset({FINISHED, LAPSED, TIMED_OUT, HANDED_BACK, PASSED_OVER, CANCELLED})

_TRANSITIONS = (
    (WAITING, DISPATCH, PENDING),
    (WAITING, TIME_OUT, TIMED_OUT),  # no capable worker within the transition timeout
    (WAITING, CANCEL, CANCELLED),
    (PENDING, START, RUNNING),
    (PENDING, FINISH, FINISHED),  # the outcome overtook its RUNNING reply
    (PENDING, TIME_OUT, TIMED_OUT),
    (PENDING, LAPSE, LAPSED),  # its worker went offline or expired
    (PENDING, HAND_BACK, HANDED_BACK),
    (PENDING, PASS_OVER, PASSED_OVER),  # not taken from a topic nothing was heard from
    (PENDING, CANCEL, CANCELLED),  # a worker dropped it unstarted, as asked
    (RUNNING, RENEW, RUNNING),
    (RUNNING, FINISH, FINISHED),
    (RUNNING, TIME_OUT, TIMED_OUT),  # past its time limit
    (RUNNING, LAPSE, LAPSED),
    (RUNNING, HAND_BACK, HANDED_BACK),
)


def build_machine() -> machines.FiniteMachine:
    """The attempt lifecycle, frozen."""
    machine = machines.FiniteMachine()
    for state in (WAITING, PENDING, RUNNING):
        machine.add_state(state)
    for state in ENDED:
        machine.add_state(state, terminal=True)
    machine.default_start_state = WAITING
    for start, event, end in _TRANSITIONS:
        machine.add_transition(start, end, event)
    machine.freeze()
    return machine


#: The one machine; attempts keep their own state and look transitions up here.
MACHINE = build_machine()
_NEXT: dict[tuple[str, str], str] = {(start, event): end for start, event, end in MACHINE}


class AttemptError(ValueError):
    """An event the attempt's state does not allow (names the attempt, state and event)."""


class Attempt:
    """One attempt: its state, and when its clock makes something due.

    Args:
        name: What it is an attempt at (for errors), e.g. ``"task 'x' attempt 2"``.
        clock: Monotonic clock in seconds.
        timeout: Seconds it may stay WAITING or PENDING (None: forever).
        lease_timeout: Seconds a RUNNING attempt lasts without a renewal (None: no lease).
        time_limit: Seconds it may be RUNNING (None: no limit).
    """

    __slots__ = ("name", "state", "created", "started", "lease_until", "_clock", "timeout",
                 "lease_timeout", "time_limit")

    def __init__(self, name: str, clock: Callable[[], float], timeout: float | None = None,
                 lease_timeout: float | None = None, time_limit: float | None = None) -> None:
        self.name, self._clock = name, clock
        self.timeout, self.lease_timeout, self.time_limit = timeout, lease_timeout, time_limit
        self.state = WAITING
        self.created = clock()
        self.started: float | None = None
        self.lease_until: float | None = None

    @property
    def ended(self) -> bool:
        """Whether it is over (whatever the outcome)."""
        return self.state in ENDED

    def on(self, event: str) -> str:
        """Apply ``event``; return the new state.

        Raises:
            AttemptError: ``event`` is not allowed in the current state.
        """
        try:
            end = _NEXT[(self.state, event)]
        except KeyError:
            if event not in {e for _s, e, _end in _TRANSITIONS}:
                raise AttemptError(f"{self.name}: unknown event {event!r}") from None
            raise AttemptError(f"{self.name}: event {event!r} is not allowed in state "
                               f"{self.state}") from None
        now = self._clock()
        if event == START:
            self.started = now
        if event in (START, RENEW) and self.lease_timeout is not None:
            self.lease_until = now + self.lease_timeout
        self.state = end
        return end

    def extend(self, seconds: float) -> None:
        """Push a running lease's end ``seconds`` later (time the engine itself was cut off)."""
        if self.lease_until is not None:
            self.lease_until += seconds

    def shorten(self, until: float) -> None:
        """End the lease at ``until`` unless renewed before (its holder must prove it lives)."""
        if self.state == RUNNING and (self.lease_until is None or self.lease_until > until):
            self.lease_until = until

    def due(self) -> float:
        """When the clock next makes an event due (``math.inf``: never, as things stand)."""
        if self.state in (WAITING, PENDING):
            return math.inf if self.timeout is None else self.created + self.timeout
        if self.state != RUNNING:
            return math.inf
        due = math.inf
        if self.time_limit and self.started is not None:
            due = self.started + self.time_limit
        if self.lease_until is not None:
            due = min(due, self.lease_until)
        return due

    def judge(self) -> str | None:
        """The event the clock makes due now: TIME_OUT, LAPSE, or None."""
        now = self._clock()
        if self.state in (WAITING, PENDING):
            expired = self.timeout is not None and now > self.created + self.timeout
            return TIME_OUT if expired else None
        if self.state != RUNNING:
            return None
        if self.time_limit and self.started is not None and now - self.started > self.time_limit:
            return TIME_OUT
        if self.lease_until is not None and now > self.lease_until:
            return LAPSE
        return None

    def __repr__(self) -> str:
        return f"<Attempt {self.name} {self.state}>"
