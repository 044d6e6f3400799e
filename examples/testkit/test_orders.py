"""The order flow's tests, on the flowengine test kit: each runs the real flow on a worker-based
engine with two workers in this process, and takes well under a second whatever the flow waits:
an hour of retry delay, a lost worker's lease and an hour's time limit pass on the kit's clock.
"""

from __future__ import annotations

import orders

from flowengine import exceptions as exc
from flowengine.testing import InjectedFault, TestKit

ORDER = {"order": "order-1", "item": "widget", "amount": 30.0}


def test_an_order_goes_through(flow_kit: TestKit) -> None:
    outcome = flow_kit.run(orders.order_flow(), store=ORDER)
    assert outcome.state == "SUCCESS"
    assert outcome.results["parcel"] == "parcel-order-1"
    for step in ("reserve", "charge", "ship"):
        flow_kit.ledger.assert_ran_once(step)
    assert flow_kit.ledger.state() == {"stock/order-1": "widget", "charge/order-1": 30.0,
                                       "balance": -30.0}


def test_a_busy_gateway_is_tried_again_an_hour_later(flow_kit: TestKit) -> None:
    orders.payments.busy_for = 1
    started = flow_kit.clock()
    outcome = flow_kit.run(orders.order_flow(), store=ORDER)
    assert outcome.state == "SUCCESS"
    assert flow_kit.clock() - started >= 3600  # the hour passed on the kit's clock only
    flow_kit.ledger.assert_ran("charge", 2)
    flow_kit.ledger.assert_changed_once("charge/order-1")


def test_a_worker_lost_after_charging_does_not_charge_twice(flow_kit: TestKit) -> None:
    # The worker dies between charging the card and reporting it: the engine charges again
    # elsewhere, and the idempotency key makes the gateway take it once.
    flow_kit.lose_worker("charge", after_effects=True)
    outcome = flow_kit.run(orders.order_flow(), store=ORDER)
    assert outcome.state == "SUCCESS"
    flow_kit.ledger.assert_ran("charge", 2)
    flow_kit.ledger.assert_changed_once("charge/order-1")
    assert flow_kit.ledger.state()["balance"] == -30.0


def test_a_failed_shipment_refunds_and_releases(flow_kit: TestKit) -> None:
    flow_kit.fail_execute("ship")
    outcome = flow_kit.run(orders.order_flow(), store=ORDER)
    assert outcome.state == "REVERTED" and outcome.failed_with(InjectedFault)
    flow_kit.ledger.assert_reverted_in_order("ship", "charge", "reserve")
    flow_kit.assert_compensated(outcome)
    assert flow_kit.ledger.state() == {"balance": 0.0}


def test_refunds_and_releases_are_idempotent(flow_kit: TestKit) -> None:
    flow_kit.fail_execute("ship")
    flow_kit.revert_twice()  # every revert runs twice in a row
    outcome = flow_kit.run(orders.order_flow(), store=ORDER)
    assert outcome.state == "REVERTED"
    flow_kit.assert_compensated(outcome)  # the second calls changed nothing
    assert flow_kit.ledger.state() == {"balance": 0.0}


def test_a_courier_that_never_answers_times_out_after_an_hour(flow_kit: TestKit) -> None:
    orders.courier.hang = True
    running = flow_kit.launch(orders.order_flow(), store=ORDER)
    flow_kit.ledger.wait_for_call("ship")
    running.advance_until(3601)  # past ship's time limit of an hour
    outcome = running.outcome()
    orders.courier.answer.set()  # the courier's call ends (its late answer is ignored)
    assert outcome.state == "REVERTED" and outcome.failed_with(exc.TaskTimeLimitExceeded)
    flow_kit.ledger.assert_reverted_in_order("ship", "charge", "reserve")
