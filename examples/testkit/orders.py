"""An order service's flow, as its team writes it: reserve stock, charge the card, ship.

The tasks reach the outside world through three small clients (``stock``, ``payments``,
``courier``). In production they would call real services; here they are fakes built on
:mod:`flowengine.testing.effects`, so a test sees every change they make, with the value
before and after, and which task call made it.

- The payment gateway is sometimes busy: ``charge`` fails, and its retry controller waits an
  hour before trying again (``Times(3, delay=3600)``).
- ``charge`` passes an idempotency key (the order id) so a charge sent twice, after a worker
  died between charging and reporting, is taken once; its revert refunds once, however often
  it runs.
- Shipping may hang: ``ship`` has a time limit of an hour.
"""

from __future__ import annotations

import threading
from typing import Any

from flowengine import retry, task
from flowengine.flows import linear_flow
from flowengine.testing import effects
from flowengine.types.failure import Failure


class GatewayBusy(RuntimeError):
    """The payment gateway asks to be tried later."""


class stock:  # noqa: N801 - a client module's stand-in
    """The stock service: items reserved per order."""

    @staticmethod
    def reserve(order: str, item: str) -> None:
        effects.put(f"stock/{order}", item)

    @staticmethod
    def release(order: str) -> None:
        effects.delete(f"stock/{order}")


class payments:  # noqa: N801
    """The payment gateway: charges taken once per idempotency key."""

    #: Charges the gateway turns away as busy before it takes one (tests set it).
    busy_for = 0

    @classmethod
    def charge(cls, key: str, amount: float) -> str:
        if cls.busy_for > 0:
            cls.busy_for -= 1
            raise GatewayBusy("payment gateway busy, try again later")
        if effects.get(f"charge/{key}") is None:  # the gateway's idempotency
            effects.put(f"charge/{key}", amount)
            effects.add("balance", -amount)
        return f"charge-{key}"

    @staticmethod
    def refund(key: str) -> None:
        amount = effects.get(f"charge/{key}")
        if amount is not None:  # refunding what was never charged, or twice, does nothing
            effects.delete(f"charge/{key}")
            effects.add("balance", amount)


class courier:  # noqa: N801
    """The courier service; ``hang`` makes it never answer (until ``answer`` is set)."""

    hang = False
    answer = threading.Event()

    @classmethod
    def ship(cls, order: str) -> str:
        if cls.hang:
            cls.answer.wait(60)
        effects.note("shipped", order=order)
        return f"parcel-{order}"


class Reserve(task.Task):
    def execute(self, order: str, item: str) -> str:
        stock.reserve(order, item)
        return item

    def revert(self, order: str, result: Any = None, **kwargs: Any) -> None:
        stock.release(order)  # idempotent: releasing twice releases once


class Charge(task.Task):
    def execute(self, order: str, amount: float) -> str:
        return payments.charge(key=order, amount=amount)

    def revert(self, order: str, result: Any = None, **kwargs: Any) -> None:
        if isinstance(result, Failure):
            return  # nothing was charged
        payments.refund(order)


class Ship(task.Task):
    time_limit = 3600.0

    def execute(self, order: str) -> str:
        return courier.ship(order)


def order_flow() -> linear_flow.Flow:
    """The order flow (a factory: ``flowengine run orders:order_flow`` builds it)."""
    paying = linear_flow.Flow("paying", retry=retry.Times(3, name="gateway", delay=3600.0))
    paying.add(Charge("charge", provides="receipt"))
    return linear_flow.Flow("order").add(Reserve("reserve", provides="reserved"), paying,
                                         Ship("ship", provides="parcel"))
