"""Revert rehearsal: a booking flow whose refund is not idempotent, found, then fixed.

``charge_card`` refunds by adding the amount back to the customer's balance: run twice (a
revert redelivered after a worker died, an operator retrying a stuck rollback), it refunds
twice. ``flowengine rehearse`` finds exactly that atom; the fixed flow refunds once, by the
charge's id, and passes. The tasks reach the outside world through
``flowengine.testing.effects`` (a fake of the seat and payment services), so the rehearsal
sees every change they make.

    flowengine rehearse rehearse_booking:booking --store seat=12A       (from examples/)
    flowengine rehearse rehearse_booking:fixed_booking --store seat=12A

Run: python examples/rehearse_booking.py
"""

from __future__ import annotations

from typing import Any

from flowengine import task
from flowengine.flows import linear_flow
from flowengine.testing import effects
from flowengine.types.failure import Failure

PRICE = 120


class ReserveSeat(task.Task):
    def execute(self, seat: str) -> str:
        effects.put(f"seat/{seat}", "held")
        return seat

    def revert(self, seat: str, result: Any = None, **kwargs: Any) -> None:
        effects.delete(f"seat/{seat}")  # releasing twice releases once


class ChargeCard(task.Task):
    """Charges the card; its revert refunds by adding the amount back: twice if run twice."""

    def execute(self, seat: str) -> str:
        effects.add("balance", -PRICE)
        return f"charge-{seat}"

    def revert(self, seat: str, result: Any = None, **kwargs: Any) -> None:
        if isinstance(result, Failure):
            return  # the charge never happened: nothing to refund
        effects.add("balance", PRICE)


class RefundOnce(ChargeCard):
    """The fix: the refund is recorded under the charge's id and made only once."""

    def revert(self, seat: str, result: Any = None, **kwargs: Any) -> None:
        if isinstance(result, Failure) or effects.get(f"refund/{result}") is not None:
            return
        effects.add("balance", PRICE)
        effects.put(f"refund/{result}", PRICE)


class SendTicket(task.Task):
    def execute(self, seat: str) -> str:
        effects.note("ticket sent", seat=seat)
        return f"ticket-{seat}"


def booking() -> linear_flow.Flow:
    """The flow with the refund that is not idempotent."""
    return linear_flow.Flow("booking").add(
        ReserveSeat("reserve_seat"), ChargeCard("charge_card", provides="charge"),
        SendTicket("send_ticket"))


def fixed_booking() -> linear_flow.Flow:
    """The same flow, its refund made once."""
    return linear_flow.Flow("booking").add(
        ReserveSeat("reserve_seat"), RefundOnce("charge_card", provides="charge"),
        SendTicket("send_ticket"))


def main() -> None:
    from flowengine.testing import rehearsal

    for factory in (booking, fixed_booking):
        report = rehearsal.rehearse(factory, {"seat": "12A"}, rehearsal.KitStage("serial"))
        print(f"== {factory.__name__}")
        print(report.text())


if __name__ == "__main__":
    main()
