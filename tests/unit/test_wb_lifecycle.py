"""One attempt's lifecycle, step by step on a hand-moved clock: no broker, no thread.

Every transition of :mod:`flowengine.worker_based.engine_side.lifecycle`: sending, starting
(with and without a RUNNING reply), leases renewed and lapsing, losses and what follows them
(sent again, counted or not, or given up and parked), hand-backs, pickups, revocation, stops,
time limits, an outage of the engine's own, and replies that come too late to matter.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from manual_clock import ManualClock

from flowengine import exceptions as exc
from flowengine.types.failure import Failure
from flowengine.worker_based.engine_side import lifecycle as lc

POLICY = lc.Policy(timeout=30.0, lease_timeout=5.0, heartbeat_interval=1.0, max_attempts=3,
                   unserved_timeout=4.0, pickup_timeout=2.0)


def kinds(effects: list[lc.Effect]) -> list[str]:
    return [type(effect).__name__ for effect in effects]


def fresh(clock: ManualClock, **changes: object) -> lc.Attempt:
    return lc.first("req-1", "resize", "execute", POLICY, clock.now, **changes)  # type: ignore[arg-type]


def sent(clock: ManualClock, worker: str = "w1", flowengine: bool = True,
         **changes: object) -> lc.Attempt:
    attempt, effects = lc.step(fresh(clock, **changes), lc.Sent(worker, "topic", flowengine),
                               clock.now)
    assert attempt.state == lc.PENDING and kinds(effects) == ["Announce"]
    return attempt


def running(clock: ManualClock, worker: str = "w1", flowengine: bool = True) -> lc.Attempt:
    attempt, _ = lc.step(sent(clock, worker, flowengine), lc.Started(worker, flowengine),
                         clock.now)
    assert attempt.state == lc.RUNNING
    return attempt


def test_sending_records_the_worker_and_announces_it() -> None:
    clock = ManualClock()
    attempt, effects = lc.step(fresh(clock), lc.Sent("w1", "topic", True), clock.now)
    assert (attempt.state, attempt.worker, attempt.topic) == (lc.PENDING, "w1", "topic")
    assert attempt.tally.workers == ("w1",)
    assert effects == [lc.Announce("task-sent", {"topic": "topic", "worker": "w1",
                                                 "action": "execute"})]
    assert attempt.pickup_due == clock.now + POLICY.pickup_timeout


def test_a_taskflow_worker_is_given_no_pickup_deadline_and_its_run_holds_no_lease() -> None:
    clock = ManualClock()
    attempt = sent(clock, "topic", flowengine=False)
    assert attempt.pickup_due is None
    started, _ = lc.step(attempt, lc.Started(None, False), clock.now)
    assert started.state == lc.RUNNING and started.lease_until is None
    clock.advance(1000.0)
    assert lc.step(started, lc.Tick(), clock.now)[1] == []


def test_a_running_reply_starts_the_lease_and_heartbeats_renew_it_until_it_lapses() -> None:
    clock = ManualClock()
    attempt = running(clock)
    assert attempt.started == clock.now and attempt.lease_until == clock.now + 5.0
    clock.advance(4.0)
    attempt, effects = lc.step(attempt, lc.Beat("w1"), clock.now)
    assert effects == [] and attempt.lease_until == clock.now + 5.0
    assert lc.due(attempt, clock.now) == clock.now + 5.0
    clock.advance(5.0)
    assert lc.step(attempt, lc.Tick(), clock.now) == (attempt, [])
    clock.advance(0.1)
    lost, effects = lc.step(attempt, lc.Tick(), clock.now)
    assert lost.state == lc.FAILURE and lost.ending == lc.LOST
    assert kinds(effects) == ["Silence", "Announce", "Retry"]
    assert effects[0] == lc.Silence("w1", "its lease lapsed (no heartbeat)")


def test_silence_is_believed_only_once_every_reply_sent_before_the_deadline_was_read() -> None:
    # An engine process busy with thousands of flows reads its replies late: a heartbeat or a
    # RUNNING reply sent in time may still wait in the reply queue when the deadline passes.
    clock = ManualClock()
    attempt = running(clock)
    lease_end = attempt.lease_until
    assert lease_end is not None
    clock.advance(6.0)
    backlogged = lc.Tick(caught_up=lease_end - 1.0)  # replies not read since before the end
    assert lc.step(attempt, backlogged, clock.now) == (attempt, [])
    lost, effects = lc.step(attempt, lc.Tick(caught_up=lease_end + 0.5), clock.now)
    assert lost.ending == lc.LOST and kinds(effects) == ["Silence", "Announce", "Retry"]
    # A reply queue never found empty (steady traffic) delays the verdict by a lease at most.
    clock.advance(POLICY.lease_timeout)
    late, effects = lc.step(attempt, backlogged, clock.now)
    assert late.ending == lc.LOST and kinds(effects) == ["Silence", "Announce", "Retry"]
    pending = sent(clock)
    assert pending.pickup_due is not None
    clock.advance(POLICY.pickup_timeout)
    assert lc.step(pending, lc.Tick(caught_up=pending.pickup_due - 0.1), clock.now)[1] == []
    assert lc.step(pending, lc.Tick(caught_up=clock.now), clock.now)[1] == [
        lc.CheckPickup("topic")]


def test_a_verdict_waiting_for_the_reply_queue_is_due_again_only_when_its_grace_ends() -> None:
    # An engine process too busy to find its reply queue empty must not look at such an
    # attempt on every pass: only a catch-up (noticed by the executor) or the grace's end can
    # decide it.
    clock = ManualClock()
    attempt = running(clock)
    lease_end = attempt.lease_until
    assert lease_end is not None
    assert lc.due(attempt, clock.now) == lease_end and not lc.awaits_catch_up(attempt, clock.now)
    clock.advance(6.0)
    backlogged = lc.Tick(caught_up=lease_end - 1.0)
    assert lc.step(attempt, backlogged, clock.now) == (attempt, [])
    assert lc.awaits_catch_up(attempt, clock.now)
    assert lc.due(attempt, clock.now) == lease_end + POLICY.lease_timeout  # type: ignore[operator]
    clock.now = lease_end + POLICY.lease_timeout + 0.01  # type: ignore[operator]
    assert lc.step(attempt, backlogged, clock.now)[0].ending == lc.LOST, "decided when due"
    pending = sent(clock)
    pickup = pending.pickup_due
    assert pickup is not None and lc.due(pending, clock.now) == pickup
    clock.now = pickup + 0.5
    assert lc.step(pending, lc.Tick(caught_up=pickup - 0.1), clock.now) == (pending, [])
    assert lc.awaits_catch_up(pending, clock.now)
    assert lc.due(pending, clock.now) == pickup + POLICY.pickup_timeout  # type: ignore[operator]
    clock.now = pickup + POLICY.pickup_timeout + 0.01  # type: ignore[operator]
    assert lc.step(pending, lc.Tick(caught_up=pickup - 0.1), clock.now)[1] == [
        lc.CheckPickup("topic")]


def test_a_short_task_with_no_running_reply_finishes_from_pending() -> None:
    clock = ManualClock()
    attempt, effects = lc.step(sent(clock), lc.Finished(lc.SUCCESS, 42), clock.now)
    assert (attempt.state, attempt.ending) == (lc.SUCCESS, lc.FINISHED)
    assert effects == [lc.Complete(42)]


def test_a_first_heartbeat_without_a_running_reply_starts_the_attempt() -> None:
    clock = ManualClock()
    attempt = sent(clock)
    clock.advance(1.0)
    attempt, effects = lc.step(attempt, lc.Beat("w1"), clock.now)
    assert attempt.state == lc.RUNNING and effects == []
    assert attempt.started == clock.now and attempt.lease_until == clock.now + 5.0
    assert attempt.pickup_due is None, "a started attempt is not passed over"


def test_a_failure_outcome_completes_with_the_failure() -> None:
    clock = ManualClock()
    failure = Failure.from_exception(RuntimeError("no"))
    attempt, effects = lc.step(running(clock), lc.Finished(lc.FAILURE, failure), clock.now)
    assert attempt.state == lc.FAILURE and effects == [lc.Complete(failure)]


def test_an_ended_attempt_ignores_whatever_comes_after() -> None:
    clock = ManualClock()
    done, _ = lc.step(running(clock), lc.Finished(lc.SUCCESS, 1), clock.now)
    for event in (lc.Finished(lc.SUCCESS, 2), lc.Started("w1", True), lc.Beat("w1"),
                  lc.HandedBack("w2"), lc.Lost("gone"), lc.Tick(), lc.Revoke(),
                  lc.Stop("cancel")):
        clock.advance(100.0)
        assert lc.step(done, event, clock.now) == (done, [])


def test_a_waiting_attempt_expires_after_its_transition_timeout() -> None:
    clock = ManualClock()
    attempt = fresh(clock)
    assert lc.due(attempt, clock.now) == clock.now + POLICY.unserved_timeout
    clock.advance(30.0)
    assert lc.step(attempt, lc.Tick(), clock.now) == (attempt, [])
    clock.advance(0.1)
    ended, effects = lc.step(attempt, lc.Tick(), clock.now)
    assert ended.ending == lc.TIMED_OUT and kinds(effects) == ["Expire"]
    assert "has expired after waiting for 30.0 seconds" in effects[0].message  # type: ignore[union-attr]


def test_a_waiting_attempt_fails_fast_only_when_workers_are_known() -> None:
    clock = ManualClock()
    attempt = fresh(clock)
    clock.advance(4.0)
    assert lc.step(attempt, lc.Tick(workers_known=False), clock.now) == (attempt, [])
    ended, effects = lc.step(attempt, lc.Tick(workers_known=True), clock.now)
    assert ended.state == lc.FAILURE and effects == [lc.Unserved()]
    assert lc.due(attempt, clock.now) == attempt.created + POLICY.timeout  # type: ignore[operator]


def test_a_delayed_attempt_counts_its_timeouts_from_the_end_of_its_delay() -> None:
    clock = ManualClock()
    attempt = fresh(clock, not_before=clock.now + 100.0)
    assert attempt.created == clock.now + 100.0
    due = clock.now + 100.0
    # Sent (held until due) during its delay: its pickup counts from the end of the delay.
    pending, _ = lc.step(attempt, lc.Sent("w1", "topic", True), clock.now + 10.0)
    assert pending.pickup_due == due + POLICY.pickup_timeout
    # Still in its delay when its worker goes away: nobody holds it, it is not lost.
    assert lc.step(pending, lc.Lost("went offline"), clock.now + 50.0) == (pending, [])
    clock.advance(120.0)
    assert lc.step(attempt, lc.Tick(), clock.now) == (attempt, [])


def test_the_time_limit_fails_a_running_attempt() -> None:
    clock = ManualClock()
    attempt, _ = lc.step(sent(clock, time_limit=3.0), lc.Started("w1", True), clock.now)
    assert lc.due(attempt, clock.now) == clock.now + 3.0
    clock.advance(3.5)
    ended, effects = lc.step(attempt, lc.Tick(), clock.now)
    assert ended.ending == lc.TIMED_OUT
    [fail] = effects
    assert isinstance(fail, lc.Fail) and isinstance(fail.error, exc.TaskTimeLimitExceeded)


def test_an_awaited_call_on_a_flowengine_worker_gets_its_cleanup_grace_past_the_limit() -> None:
    # Its worker cancels the coroutine at the limit and replies after its cleanup: the engine
    # waits for that reply (its failure is the outcome) before it reverts anything.
    clock = ManualClock()
    attempt, _ = lc.step(sent(clock, time_limit=3.0, awaited=True), lc.Started("w1", True),
                         clock.now)
    assert lc.due(attempt, clock.now) == clock.now + 3.0 + lc.CLEANUP_GRACE
    clock.advance(3.5)
    assert lc.step(attempt, lc.Tick(), clock.now) == (attempt, [])
    failure = Failure.from_exception(exc.TaskTimeLimitExceeded("resize", 3.0, elapsed=3.0))
    ended, effects = lc.step(attempt, lc.Finished(lc.FAILURE, failure), clock.now)
    assert (ended.state, ended.ending) == (lc.FAILURE, lc.FINISHED)
    assert effects == [lc.Complete(failure)]
    # A worker that never replies: the engine's own verdict once the grace is over.
    clock.advance(lc.CLEANUP_GRACE)
    ended, effects = lc.step(attempt, lc.Tick(), clock.now)
    assert ended.ending == lc.TIMED_OUT
    [fail] = effects
    assert isinstance(fail, lc.Fail) and isinstance(fail.error, exc.TaskTimeLimitExceeded)
    assert "time limit of 3s (ran 5.500s)" in str(fail.error)


@pytest.mark.parametrize(("awaited", "flowengine"), [(False, True), (True, False)])
def test_a_thread_call_or_a_taskflow_worker_gets_no_grace(awaited: bool,
                                                         flowengine: bool) -> None:
    # A thread cannot be stopped, and a TaskFlow worker knows no limits: nothing to wait for.
    clock = ManualClock()
    attempt, _ = lc.step(sent(clock, flowengine=flowengine, time_limit=3.0, awaited=awaited),
                         lc.Started("w1", flowengine), clock.now)
    assert lc.due(attempt, clock.now) == clock.now + 3.0
    clock.advance(3.5)
    assert lc.step(attempt, lc.Tick(), clock.now)[0].ending == lc.TIMED_OUT


def test_the_next_attempt_is_awaited_as_its_predecessor_was() -> None:
    clock = ManualClock()
    ended, _ = lc.step(running(clock), lc.Lost("its worker w1 expired"), clock.now)
    assert lc.follow(dataclasses.replace(ended, awaited=True), "req-2", clock.now).awaited


def test_a_lost_attempt_is_sent_again_until_max_attempts_then_parked_and_failed() -> None:
    clock = ManualClock()
    attempt = running(clock)
    for number in (1, 2):
        ended, effects = lc.step(attempt, lc.Lost("its worker w1 expired"), clock.now)
        # The second attempt was sent and never heard running: workers are told to drop it.
        withdrawn = ["Withdraw"] if number == 2 else []
        assert kinds(effects) == [*withdrawn, "Announce", "Retry"], number
        assert effects[-1] == lc.Retry("its worker w1 expired")
        attempt = lc.follow(ended, f"req-{number + 1}", clock.now)
        assert (attempt.number, attempt.state, attempt.request_id) == (
            number + 1, lc.WAITING, f"req-{number + 1}")
        attempt, _ = lc.step(attempt, lc.Sent(f"w{number + 1}", "topic", True), clock.now)
    ended, effects = lc.step(attempt, lc.Lost("its worker w3 went offline"), clock.now)
    assert kinds(effects) == ["Withdraw", "Announce", "Park", "Fail"]
    [_withdraw, _lost, park, fail] = effects
    assert isinstance(fail, lc.Fail) and isinstance(fail.error, exc.WorkerLost)
    assert "the last one: its worker w3 went offline" in park.reason  # type: ignore[union-attr]
    assert attempt.tally.workers == ("w1", "w2", "w3")


def test_a_request_the_broker_no_longer_holds_is_lost_only_while_pending() -> None:
    # Judged while PENDING; by the time the verdict is applied a worker may have said it runs
    # it (then the broker held it after all: the RUNNING attempt keeps going).
    clock = ManualClock()
    unheld = lc.Lost("the broker no longer holds its request", unheld=True)
    ended, effects = lc.step(sent(clock), unheld, clock.now)
    assert ended.ending == lc.LOST and kinds(effects) == ["Withdraw", "Announce", "Retry"]
    attempt = running(clock)
    assert lc.step(attempt, unheld, clock.now) == (attempt, [])
    # A quiet start's PENDING attempt may be running unannounced: its holder must prove it.
    suspected, effects = lc.step(sent(clock), lc.Lost("gone", quiet_start=True, unheld=True),
                                 clock.now)
    assert (suspected.state, suspected.suspect, effects) == (lc.RUNNING, "its lease lapsed: "
                                                             "gone, and no other worker said "
                                                             "it runs it", [])


def test_a_lost_attempt_no_worker_was_heard_running_is_withdrawn_before_it_is_sent_again(
) -> None:
    # A worker other than the one presumed may hold it unstarted (taken, then frozen): it must
    # drop it when it thaws rather than run it beside the next attempt.
    clock = ManualClock()
    ended, effects = lc.step(sent(clock), lc.Lost("its worker w1 went offline"), clock.now)
    assert effects[0] == lc.Withdraw("its worker w1 went offline") and ended.ending == lc.LOST
    # Taken for running unannounced (a quiet start), then silent through its proof of life.
    suspected, _ = lc.step(sent(clock), lc.Lost("gone", quiet_start=True), clock.now)
    assert suspected.lease_until is not None
    clock.now = suspected.lease_until + 60
    _ended, effects = lc.step(suspected, lc.Tick(), clock.now)
    assert kinds(effects)[:2] == ["Silence", "Withdraw"], effects
    # One a worker said it runs is not withdrawn: that worker runs it, or is gone with it.
    _ended, effects = lc.step(running(clock), lc.Lost("its worker w1 expired"), clock.now)
    assert "Withdraw" not in kinds(effects)
    # Nor one that a heartbeat showed running (a worker that sends no RUNNING reply).
    beating, _ = lc.step(suspected, lc.Beat("w2"), clock.now - 60)
    _ended, effects = lc.step(beating, lc.Lost("its worker w2 expired"), clock.now)
    assert "Withdraw" not in kinds(effects)


def test_a_request_handed_back_unstarted_is_sent_again_without_counting_an_attempt() -> None:
    clock = ManualClock()
    ended, effects = lc.step(sent(clock), lc.HandedBack("w2"), clock.now)
    assert ended.ending == lc.HANDED_BACK and effects == [lc.Retry(None)]
    again = lc.follow(ended, "req-2", clock.now)
    assert again.number == 2 and again.counted == 1 and again.tally.resent == 1


def test_a_running_request_handed_back_must_prove_its_holder_alive() -> None:
    clock = ManualClock()
    attempt = running(clock)
    attempt, effects = lc.step(attempt, lc.HandedBack("w2"), clock.now)
    assert effects == [] and attempt.suspect is not None
    assert attempt.lease_until == clock.now + lc.PROOF_OF_LIFE * POLICY.heartbeat_interval
    alive, _ = lc.step(attempt, lc.Beat("w1"), clock.now + 1.0)
    assert alive.suspect is None and alive.lease_until == clock.now + 1.0 + 5.0
    clock.advance(2.0)
    lost, effects = lc.step(attempt, lc.Tick(), clock.now)
    assert lost.ending == lc.LOST and "redelivered it to worker w2" in effects[0].why  # type: ignore[union-attr]


def test_a_worker_that_does_not_run_the_class_hands_it_back_to_be_sent_elsewhere() -> None:
    clock = ManualClock()
    ended, effects = lc.step(sent(clock), lc.NotServed("w2"), clock.now)
    assert effects == [lc.Retry(None)] and ended.tally.not_served == 1
    again = lc.follow(ended, "req-2", clock.now)
    for _ in range(lc.MAX_NOT_SERVED - 1):
        again, _ = lc.step(again, lc.Sent("w2", "topic", True), clock.now)
        ended, _ = lc.step(again, lc.NotServed("w2"), clock.now)
        again = lc.follow(ended, "req-n", clock.now)
    again, _ = lc.step(again, lc.Sent("w2", "topic", True), clock.now)
    ended, effects = lc.step(again, lc.NotServed("w2"), clock.now)
    assert ended.state == lc.FAILURE and kinds(effects) == ["Unserved"]
    assert "handed back 21 times, the last by worker w2" in effects[0].note  # type: ignore[union-attr]


def test_a_worker_of_another_version_hands_it_back_to_be_sent_again_a_little_later() -> None:
    clock = ManualClock()
    ended, effects = lc.step(sent(clock), lc.NotServed("w2", "2.0", right_version_alive=True),
                             clock.now)
    assert effects == [lc.Retry(None)] and ended.tally.other_version == 1
    again = lc.follow(ended, "req-2", clock.now)
    assert again.not_before == clock.now + 0.02 and again.created == clock.now + 0.02


def test_a_late_hand_back_of_a_running_request_is_not_a_not_served() -> None:
    clock = ManualClock()
    attempt = running(clock)
    assert lc.step(attempt, lc.NotServed("w2"), clock.now) == (attempt, [])


def test_an_attempt_nobody_takes_is_checked_then_passed_over() -> None:
    clock = ManualClock()
    attempt = sent(clock)
    assert lc.due(attempt, clock.now) == clock.now + POLICY.pickup_timeout
    clock.advance(2.0)
    attempt, effects = lc.step(attempt, lc.Tick(), clock.now)
    assert effects == [lc.CheckPickup("topic")]
    assert attempt.pickup_due == clock.now + POLICY.pickup_timeout
    ended, effects = lc.step(attempt, lc.PassOver(), clock.now)
    assert ended.ending == lc.PASSED_OVER and kinds(effects) == ["Withdraw", "Retry"]
    assert lc.follow(ended, "req-2", clock.now).counted == 1, "passing over costs no attempt"


def test_an_attempt_a_silent_worker_may_hold_is_passed_over_for_that_reason() -> None:
    clock = ManualClock()
    why = "worker w1 of topic 'topic', which may hold it unstarted, did not answer within 10s"
    ended, effects = lc.step(sent(clock), lc.PassOver(why), clock.now)
    assert ended.ending == lc.PASSED_OVER and ended.tally.rerouted == 1
    assert effects == [lc.Withdraw(why), lc.Retry(why)]
    assert lc.follow(ended, "req-2", clock.now).counted == 1, "passing over costs no attempt"


def test_a_revoked_attempt_is_never_passed_over() -> None:
    clock = ManualClock()
    attempt, effects = lc.step(sent(clock), lc.Revoke(), clock.now)
    assert attempt.revoking and effects == [lc.Withdraw("its engine suspends")]
    clock.advance(10.0)
    assert lc.step(attempt, lc.Tick(), clock.now) == (attempt, [])
    assert lc.step(attempt, lc.PassOver(), clock.now) == (attempt, [])
    assert lc.due(attempt, clock.now) == attempt.created + POLICY.timeout  # type: ignore[operator]


def test_revoking_cancels_what_was_never_sent_or_was_taken_back() -> None:
    clock = ManualClock()
    never, effects = lc.step(fresh(clock), lc.Revoke(), clock.now)
    assert never.ending == lc.CANCELLED and effects == [lc.Cancel("it was never sent")]
    back, effects = lc.step(sent(clock), lc.Revoke(taken_back=True), clock.now)
    assert back.ending == lc.CANCELLED and kinds(effects) == ["Cancel"]


def test_a_running_attempt_is_waited_for_when_its_engine_suspends() -> None:
    clock = ManualClock()
    attempt = running(clock)
    assert lc.step(attempt, lc.Revoke(), clock.now) == (attempt, [])


def test_a_revoked_attempt_a_worker_drops_is_cancelled_and_one_nobody_confirms_expires() -> None:
    clock = ManualClock()
    attempt, _ = lc.step(sent(clock), lc.Revoke(), clock.now)
    dropped, effects = lc.step(attempt, lc.Dropped("w1"), clock.now)
    assert dropped.ending == lc.CANCELLED and kinds(effects) == ["Cancel"]
    clock.advance(31.0)
    expired, effects = lc.step(attempt, lc.Tick(), clock.now)
    assert effects == [lc.Cancel("it expired unstarted after it was revoked")]


def test_a_drop_of_a_running_attempt_nobody_revoked_is_ignored() -> None:
    clock = ManualClock()
    attempt = running(clock)
    assert lc.step(attempt, lc.Dropped("w1"), clock.now) == (attempt, [])


def test_stopping_tells_the_holder_and_again_with_each_heartbeat() -> None:
    clock = ManualClock()
    attempt, effects = lc.step(running(clock), lc.Stop("cancelled by op"), clock.now)
    assert attempt.stopping == "cancelled by op" and effects == [lc.TellStop("w1")]
    attempt, effects = lc.step(attempt, lc.Beat("w1"), clock.now)
    assert effects == [lc.TellStop("w1")]
    # Lost while stopping: not sent again, failed (its flow reverts what it did).
    ended, effects = lc.step(attempt, lc.Lost("gone"), clock.now)
    assert kinds(effects) == ["Announce", "Fail"]


def test_stopping_cancels_what_was_never_sent_and_reverts_are_not_stopped() -> None:
    clock = ManualClock()
    ended, effects = lc.step(fresh(clock), lc.Stop("cancel"), clock.now)
    assert effects == [lc.Cancel("it was never sent")]
    revert = lc.first("req-r", "resize", "revert", POLICY, clock.now)
    assert lc.step(revert, lc.Stop("cancel"), clock.now) == (revert, [])


def test_a_stopping_attempt_handed_back_is_cancelled_not_sent_again() -> None:
    clock = ManualClock()
    attempt, _ = lc.step(sent(clock), lc.Stop("cancel"), clock.now)
    ended, effects = lc.step(attempt, lc.HandedBack("w2"), clock.now)
    assert effects == [lc.Cancel("its flow is being cancelled")]


def test_a_holder_other_than_the_addressee_takes_the_attempt_over() -> None:
    clock = ManualClock()
    attempt, effects = lc.step(sent(clock, "w1"), lc.Started("w2", True), clock.now)
    assert attempt.worker == "w2" and attempt.runner == "w2"
    assert attempt.tally.workers == ("w2",)
    assert effects == [lc.Announce("task-moved", {"worker": "w2", "from_worker": "w1"})]
    again, effects = lc.step(attempt, lc.Started("w2", True), clock.now)
    assert effects == [] and again.runner == "w2"


def test_a_worker_waiting_for_a_limit_restarts_the_transition_timeout() -> None:
    clock = ManualClock()
    attempt = sent(clock)
    clock.advance(20.0)
    attempt, effects = lc.step(attempt, lc.Waiting(), clock.now)
    assert effects == [] and attempt.created == clock.now
    clock.advance(29.0)
    assert kinds(lc.step(attempt, lc.Tick(), clock.now)[1]) != ["Expire"]


def test_the_engines_own_outage_extends_leases_and_pickups() -> None:
    clock = ManualClock()
    attempt = running(clock)
    lease = attempt.lease_until
    attempt, _ = lc.step(attempt, lc.Resumed(10.0), clock.now)
    assert attempt.lease_until == lease + 10.0 + lc.PROOF_OF_LIFE * POLICY.heartbeat_interval  # type: ignore[operator]


def test_unsendable_broken_and_abandoned_attempts_end_once() -> None:
    clock = ManualClock()
    failure = Failure.from_exception(OSError("down"))
    ended, effects = lc.step(fresh(clock), lc.Unsendable(failure), clock.now)
    assert ended.state == lc.FAILURE and effects == [lc.Complete(failure)]
    error = exc.InvalidFormat("garbled")
    ended, effects = lc.step(running(clock), lc.Broken(error), clock.now)
    assert effects == [lc.Fail(error)]
    stopped = exc.RequestTimeout("executor stopped")
    ended, effects = lc.step(sent(clock), lc.Abandoned("stopped", stopped), clock.now)
    assert effects == [lc.Fail(stopped)]
    ended, effects = lc.step(fresh(clock), lc.Abandoned("cancelled"), clock.now)
    assert ended.ending == lc.CANCELLED and effects == []


@pytest.mark.parametrize("state", [lc.SUCCESS, lc.FAILURE])
def test_nothing_is_due_for_an_ended_attempt(state: str) -> None:
    clock = ManualClock()
    ended, _ = lc.step(running(clock), lc.Finished(state, None), clock.now)
    assert lc.due(ended, clock.now) == math.inf
