"""The test kit: in-process workers, a clock that skips waits and leases, faults, the ledger.

Every test here runs real workers (threads of this process on the memory transport) and a real
worker-based engine; nothing sleeps and nothing waits out the delays the flows declare: an hour
of retry delay or start delay, a lost worker's lease, a task's time limit all pass on the kit's
clock.
"""

from __future__ import annotations

from collections.abc import Iterator

import kit_tasks as kt  # tests/testkit is on sys.path (pytest rootdir insertion)
import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.flows import linear_flow
from flowengine.testing import InjectedFault, TestKit
from flowengine.testing import ledger as lg

SEAT = {"seat": "12A"}


@pytest.fixture
def kit() -> Iterator[TestKit]:
    with TestKit() as opened:
        yield opened


@pytest.fixture
def serial_kit() -> Iterator[TestKit]:
    with TestKit(engine="serial") as opened:
        yield opened


def test_a_flow_runs_on_the_kits_workers_and_every_call_is_in_the_ledger(kit: TestKit) -> None:
    outcome = kit.run(kt.booking(), store=SEAT)
    assert outcome.state == states.SUCCESS and outcome.error is None
    assert outcome.results["seat"] == "12A"
    for atom in ("reserve", "charge", "ticket"):
        kit.ledger.assert_ran_once(atom)
    calls = kit.ledger.calls(run=outcome.run)
    assert [c.atom for c in calls] == ["reserve", "charge", "ticket"]
    assert all(c.worker and c.worker.startswith("worker-") for c in calls)  # ran remotely
    assert kit.ledger.state() == {"seat/12A": "held", "balance": -100}


def test_a_failed_execute_is_undone_in_reverse_order(kit: TestKit) -> None:
    kit.fail_execute("ticket")
    outcome = kit.run(kt.booking(), store=SEAT)
    assert outcome.state == states.REVERTED
    assert outcome.failed_with(InjectedFault)
    kit.ledger.assert_reverted_in_order("ticket", "charge", "reserve")
    kit.ledger.assert_not_ran("ticket")  # failed before its own code ran
    kit.assert_compensated(outcome)
    assert kit.ledger.state() == {"balance": 0, "refund/12A": 100}


def test_a_fault_on_one_attempt_lets_the_retry_succeed(kit: TestKit) -> None:
    kit.fail_execute("flaky", attempt=1)
    outcome = kit.run(kt.retried(delay=3600.0, succeed_at=1), store={})
    assert outcome.state == states.SUCCESS
    assert [c.attempt for c in kit.ledger.calls("flaky", "execute")] == [2]
    assert [f.attempt for f in kit.ledger.faults()] == [1]


def test_an_hour_of_retry_delay_passes_on_the_kits_clock(kit: TestKit) -> None:
    before = kit.clock()
    outcome = kit.run(kt.retried(delay=3600.0, succeed_at=3), store={})
    assert outcome.state == states.SUCCESS
    assert kit.clock() - before >= 2 * 3600.0  # two waits of an hour, skipped
    kit.ledger.assert_ran("flaky", 3)


def test_an_hour_of_start_delay_passes_on_the_kits_clock(kit: TestKit) -> None:
    before = kit.clock()
    outcome = kit.run(linear_flow.Flow("later").add(kt.Later("later", provides="late")))
    assert outcome.state == states.SUCCESS and outcome.results["late"] == "late"
    assert kit.clock() - before >= 3600.0


def test_a_failed_revert_ends_the_flow_in_failure_naming_it(kit: TestKit) -> None:
    kit.fail_execute("ticket")
    kit.fail_revert("charge")
    outcome = kit.run(kt.booking(), store=SEAT)
    assert outcome.state == states.FAILURE
    assert outcome.atom_state("charge") == states.REVERT_FAILURE


def test_revert_twice_passes_an_idempotent_revert(kit: TestKit) -> None:
    kit.fail_execute("ticket")
    kit.revert_twice()
    outcome = kit.run(kt.booking(), store=SEAT)
    assert outcome.state == states.REVERTED
    kit.ledger.assert_reverted_in_order("ticket", "charge", "reserve")  # repeats aside
    kit.assert_compensated(outcome)
    assert kit.ledger.state()["balance"] == 0


def test_revert_twice_catches_a_revert_that_refunds_twice(kit: TestKit) -> None:
    kit.fail_execute("ticket")
    kit.revert_twice("charge")
    outcome = kit.run(kt.booking(kt.SloppyCharge), store=SEAT)
    assert outcome.state == states.REVERTED
    with pytest.raises(AssertionError, match=r"charge: revert not idempotent: its second "
                                             r"revert changed balance from 0 to 100"):
        kit.assert_compensated(outcome)


def test_a_revert_that_undoes_an_execute_that_never_ran_is_caught(kit: TestKit) -> None:
    kit.fail_execute("charge")
    outcome = kit.run(kt.booking(kt.SloppyCharge), store=SEAT)
    with pytest.raises(AssertionError, match=r"charge: revert assumes its execute ran"):
        kit.assert_compensated(outcome)


def test_a_lost_worker_is_replaced_and_its_task_runs_once_elsewhere(kit: TestKit) -> None:
    kit.lose_worker("charge")
    outcome = kit.run(kt.booking(), store=SEAT)
    assert outcome.state == states.SUCCESS
    kit.ledger.assert_ran_once("charge")
    [lost] = kit.ledger.faults()
    [ran] = kit.ledger.calls("charge")
    assert lost.outcome == lg.LOST and ran.worker != lost.worker
    assert ran.attempt == 2
    assert outcome.engine.storage.get_atom_state("charge") == states.SUCCESS


def test_a_worker_lost_after_its_effects_makes_the_task_run_twice(kit: TestKit) -> None:
    kit.lose_worker("mail", after_effects=True)
    outcome = kit.run(kt.fanout(), store=SEAT)
    assert outcome.state == states.SUCCESS
    kit.ledger.assert_ran("mail", 2)  # at least once: it ran again elsewhere...
    kit.ledger.assert_changed_once("mail/12A")  # ...and its keyed effect still applied once
    with pytest.raises(AssertionError, match="mail executed 2 time"):
        kit.ledger.assert_ran_once("mail")


def test_workers_lost_on_every_attempt_fail_the_task_with_worker_lost() -> None:
    with TestKit(max_attempts=2) as kit:
        kit.lose_worker("charge", attempt=None)
        outcome = kit.run(kt.booking(), store=SEAT)
        assert outcome.state == states.REVERTED
        assert outcome.failed_with(exc.WorkerLost)
        assert len(kit.ledger.faults()) == 2
        kit.ledger.assert_reverted_in_order("charge", "reserve")


def test_a_time_limit_of_an_hour_passes_when_the_test_moves_the_clock(kit: TestKit) -> None:
    kt.RELEASE.clear()
    try:
        running = kit.launch(linear_flow.Flow("slow").add(kt.Blocked("blocked")))
        kit.ledger.wait_for_call("blocked")
        running.advance_until(3601.0)  # the task is still running: past its hour's limit
        outcome = running.outcome()
        assert outcome.state == states.REVERTED
        assert outcome.failed_with(exc.TaskTimeLimitExceeded)
    finally:
        kt.RELEASE.set()


def test_a_flow_that_does_not_end_fails_the_test_naming_its_atoms() -> None:
    kt.RELEASE.clear()
    try:
        with TestKit(timeout=0.5) as kit:
            with pytest.raises(AssertionError,
                               match=r"did not end within 0.5s .*'blocked': 'RUNNING'"):
                kit.run(linear_flow.Flow("stuck").add(kt.Blocked("blocked")))
            kt.RELEASE.set()  # so the worker stops at once
    finally:
        kt.RELEASE.set()


def test_the_serial_engine_takes_the_same_faults(serial_kit: TestKit) -> None:
    serial_kit.fail_execute("ticket")
    outcome = serial_kit.run(kt.booking(), store=SEAT)
    assert outcome.state == states.REVERTED and isinstance(outcome.error, InjectedFault)
    serial_kit.ledger.assert_reverted_in_order("ticket", "charge", "reserve")
    assert all(c.worker is None for c in serial_kit.ledger.calls())  # ran in the engine
    with pytest.raises(ValueError, match="losing a worker needs the worker-based engine"):
        serial_kit.lose_worker("charge")


def test_a_task_a_worker_cannot_build_is_refused_with_the_reason(kit: TestKit) -> None:
    flow = linear_flow.Flow("configured").add(kt.NeedsConfig({"a": 1}, name="configured"))
    with pytest.raises(ValueError, match=r"task 'configured' \(NeedsConfig\) cannot run on a "
                                         r"worker.*TestKit\(engine='serial'\)"):
        kit.run(flow)


def test_one_kit_at_a_time(kit: TestKit) -> None:
    with pytest.raises(RuntimeError, match="another TestKit .* is open"):
        TestKit().start()
