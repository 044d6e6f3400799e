"""An order flow to run under ``flowengine chaos``: real work (each step takes a moment), real
reverts, and some orders that fail on purpose, so that flows end both SUCCESS and REVERTED.

    flowengine chaos chaos_orders:order_flow --duration 120 --url redis://localhost:6379/0

(from examples/). The task classes are the same for flowengine and for TaskFlow 6 workers:
``FLOWENGINE_TASK_LIBRARY=taskflow`` (which ``chaos --taskflow-compat`` sets for the TaskFlow
workers it starts) makes them TaskFlow tasks, as a module a fleet migrating from TaskFlow
shares between both would. Every seventh order is declined at shipping and reverted.

Run: python examples/chaos_orders.py
"""

from __future__ import annotations

import os
import time
from typing import Any

if os.environ.get("FLOWENGINE_TASK_LIBRARY") == "taskflow":
    from taskflow import task  # type: ignore[import-untyped]
    from taskflow.patterns import linear_flow
else:
    from flowengine import task  # type: ignore[no-redef]
    from flowengine.flows import linear_flow  # type: ignore[no-redef]

#: Seconds each step works for.
WORK = 0.3


class ShippingDeclined(RuntimeError):
    """The courier refuses the parcel (every seventh order, on purpose)."""


class ReserveStock(task.Task):
    def execute(self, chaos_instance: int) -> str:
        time.sleep(WORK)
        return f"stock-{chaos_instance}"

    def revert(self, chaos_instance: int, *args: Any, **kwargs: Any) -> None:
        time.sleep(WORK / 3)


class ChargeCard(task.Task):
    def execute(self, chaos_instance: int) -> str:
        time.sleep(WORK)
        return f"charge-{chaos_instance}"

    def revert(self, chaos_instance: int, *args: Any, **kwargs: Any) -> None:
        time.sleep(WORK / 3)


class Ship(task.Task):
    def execute(self, chaos_instance: int) -> str:
        time.sleep(WORK)
        if chaos_instance % 7 == 0:
            raise ShippingDeclined(f"order {chaos_instance} declined by the courier")
        return f"parcel-{chaos_instance}"


def order_flow() -> Any:
    """One order: reserve, charge, ship."""
    return linear_flow.Flow("order").add(
        ReserveStock("reserve", provides="stock"), ChargeCard("charge", provides="charge"),
        Ship("ship", provides="parcel"))


if __name__ == "__main__":
    from flowengine import engines

    print(engines.run(order_flow(), store={"chaos_instance": 1})["parcel"])
