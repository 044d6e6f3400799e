"""The request attempt lifecycle machine, driven by events and a hand-moved clock."""

from __future__ import annotations

import math

import pytest
from manual_clock import ManualClock

from flowengine.worker_based import attempt as at


def make(clock: ManualClock, **options: float | None) -> at.Attempt:
    return at.Attempt("task 't' attempt 1", clock, **options)  # type: ignore[arg-type]


def test_the_machine_is_frozen_and_every_ended_state_is_terminal() -> None:
    with pytest.raises(Exception, match="(?i)frozen"):
        at.MACHINE.add_state("EXTRA")
    assert set(at.MACHINE.states) == at.ENDED | {at.WAITING, at.PENDING, at.RUNNING}
    assert at.MACHINE.frozen
    for state in at.ENDED:
        assert not [e for s, e, _end in at.MACHINE if s == state], f"{state} is not terminal"


def test_a_waiting_attempt_times_out_after_its_transition_timeout() -> None:
    clock = ManualClock()
    attempt = make(clock, timeout=10.0)
    assert attempt.due() == clock.now + 10.0
    clock.advance(10.0)
    assert attempt.judge() is None
    clock.advance(0.1)
    assert attempt.judge() == at.TIME_OUT
    assert attempt.on(at.TIME_OUT) == at.TIMED_OUT and attempt.ended
    assert attempt.due() == math.inf and attempt.judge() is None


def test_a_running_attempt_holds_a_lease_that_renewals_extend_and_silence_lapses() -> None:
    clock = ManualClock()
    attempt = make(clock, timeout=5.0, lease_timeout=3.0)
    attempt.on(at.DISPATCH)
    clock.advance(4.0)
    attempt.on(at.START)
    assert attempt.lease_until == clock.now + 3.0
    clock.advance(10.0)  # the transition timeout no longer applies once running
    assert attempt.judge() == at.LAPSE
    attempt.on(at.RENEW)
    assert attempt.judge() is None and attempt.due() == clock.now + 3.0
    clock.advance(3.5)
    assert attempt.judge() == at.LAPSE
    assert attempt.on(at.LAPSE) == at.LAPSED


def test_the_engines_own_outage_extends_the_lease() -> None:
    clock = ManualClock()
    attempt = make(clock, lease_timeout=3.0)
    attempt.on(at.DISPATCH)
    attempt.on(at.START)
    clock.advance(20.0)
    attempt.extend(20.0)
    assert attempt.judge() is None
    clock.advance(3.1)
    assert attempt.judge() == at.LAPSE


def test_a_handed_back_running_attempt_must_prove_it_lives_sooner() -> None:
    clock = ManualClock()
    attempt = make(clock, lease_timeout=10.0)
    attempt.on(at.DISPATCH)
    attempt.on(at.START)
    attempt.shorten(clock.now + 1.0)
    clock.advance(1.5)
    assert attempt.judge() == at.LAPSE
    attempt.on(at.RENEW)  # alive after all
    assert attempt.judge() is None and attempt.lease_until == clock.now + 10.0


def test_a_time_limit_times_out_a_running_attempt_whatever_its_lease() -> None:
    clock = ManualClock()
    attempt = make(clock, lease_timeout=3.0, time_limit=5.0)
    attempt.on(at.DISPATCH)
    attempt.on(at.START)
    for _ in range(3):
        clock.advance(2.0)
        attempt.on(at.RENEW)
    assert attempt.judge() == at.TIME_OUT


def test_an_outcome_may_overtake_its_running_reply_but_ends_the_attempt_once() -> None:
    attempt = make(ManualClock())
    attempt.on(at.DISPATCH)
    assert attempt.on(at.FINISH) == at.FINISHED
    with pytest.raises(at.AttemptError, match=r"'finish' is not allowed in state FINISHED"):
        attempt.on(at.FINISH)
    with pytest.raises(at.AttemptError, match="task 't' attempt 1: unknown event 'explode'"):
        attempt.on("explode")


@pytest.mark.parametrize(("path", "end"), [
    ([at.CANCEL], at.CANCELLED),
    ([at.DISPATCH, at.CANCEL], at.CANCELLED),
    ([at.DISPATCH, at.HAND_BACK], at.HANDED_BACK),
    ([at.DISPATCH, at.START, at.HAND_BACK], at.HANDED_BACK),
    ([at.DISPATCH, at.LAPSE], at.LAPSED),
])
def test_every_way_an_attempt_ends(path: list[str], end: str) -> None:
    attempt = make(ManualClock())
    for event in path:
        attempt.on(event)
    assert attempt.state == end and attempt.ended


def test_a_running_attempt_cannot_be_cancelled() -> None:
    attempt = make(ManualClock())
    attempt.on(at.DISPATCH)
    attempt.on(at.START)
    with pytest.raises(at.AttemptError, match="'cancel' is not allowed in state RUNNING"):
        attempt.on(at.CANCEL)
