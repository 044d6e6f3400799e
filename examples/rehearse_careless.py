"""A revert that assumes its execute ran: ``flowengine rehearse`` catches it.

``charge_card``'s revert refunds whatever happened: when its execute failed before charging
(the card was declined, the payment service was down), the revert still pays the customer.
The rehearsal fails ``charge_card``'s execute and sees its revert change the balance though
nothing was charged.

    flowengine rehearse rehearse_careless:booking --store seat=12A       (from examples/)

Run: python examples/rehearse_careless.py
"""

from __future__ import annotations

from typing import Any

from rehearse_booking import PRICE, ReserveSeat, SendTicket

from flowengine import task
from flowengine.flows import linear_flow
from flowengine.testing import effects


class CarelessCharge(task.Task):
    def execute(self, seat: str) -> str:
        effects.add("balance", -PRICE)
        return f"charge-{seat}"

    def revert(self, seat: str, result: Any = None, **kwargs: Any) -> None:
        effects.add("balance", PRICE)  # even when result is a Failure: nothing was charged


def booking() -> linear_flow.Flow:
    return linear_flow.Flow("booking").add(
        ReserveSeat("reserve_seat"), CarelessCharge("charge_card"), SendTicket("send_ticket"))


if __name__ == "__main__":
    from flowengine.testing import rehearsal

    print(rehearsal.rehearse(booking, {"seat": "12A"}, rehearsal.KitStage("serial")).verdict())
