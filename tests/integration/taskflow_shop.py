"""The order flow of the TaskFlow store tests, one module for both libraries.

``SHOP_LIBRARY`` (``taskflow`` or ``flowengine``, the default) picks the base classes, as a
service moving to flowengine does by renaming imports; the flow, its atom names and the factory
a TaskFlow engine records in its flow details (``taskflow_shop.make_order``) are the same under
both, so a flowengine engine rebuilds the flow a TaskFlow engine stored.

Every execute and revert is appended to the JSON-lines ledger named by ``SHOP_LEDGER``, with the
order, the library and the process that ran it. ``charge`` fails the first time it runs for an
order (its retry runs it again); ``ship`` fails when the flow was made with ``fail_at="ship"``;
``pack`` blocks for good, once it has written its ledger line and printed ``blocked <order>``,
when ``SHOP_BLOCK`` names its order (a TaskFlow engine is then killed mid-flow).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from typing import Any

LIBRARY = os.environ.get("SHOP_LIBRARY", "flowengine")
if LIBRARY == "taskflow":
    from taskflow import retry, task
    from taskflow.patterns import linear_flow
elif LIBRARY == "flowengine":
    from flowengine import retry, task  # type: ignore[no-redef]
    from flowengine.flows import linear_flow  # type: ignore[no-redef]
else:
    raise ImportError(f"SHOP_LIBRARY must be taskflow or flowengine, not {LIBRARY!r}")


def record(action: str, atom: str, order: str) -> None:
    """Append one entry to the ledger."""
    entry = {"action": action, "atom": atom, "order": order, "library": LIBRARY,
             "pid": os.getpid()}
    with open(os.environ["SHOP_LEDGER"], "a", encoding="utf-8") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        ledger.write(json.dumps(entry) + "\n")


def ledger() -> list[dict[str, Any]]:
    """Every entry so far."""
    try:
        with open(os.environ["SHOP_LEDGER"], encoding="utf-8") as stream:
            return [json.loads(line) for line in stream]
    except FileNotFoundError:
        return []


class Declined(Exception):
    """What ``charge`` raises the first time."""


class ShippingError(RuntimeError):
    """What ``ship`` raises when told to fail."""


class Reserve(task.Task):
    default_provides = "reservation"

    def execute(self, order: str, quantity: int) -> dict[str, Any]:
        record("execute", self.name, order)
        self.update_progress(0.5)
        return {"id": f"rsv-{order}", "quantity": quantity, "bins": (3, 4)}

    def revert(self, order: str, **kwargs: Any) -> str:
        record("revert", self.name, order)
        return f"released rsv-{order}"


class Charge(task.Task):
    default_provides = "receipt"

    def execute(self, order: str, reservation: dict[str, Any]) -> str:
        first = not any(e["atom"] == self.name and e["order"] == order and
                        e["action"] == "execute" for e in ledger())
        record("execute", self.name, order)
        if first:
            raise Declined(f"card declined for {reservation['id']}")
        return f"rcpt-{reservation['id']}"

    def revert(self, order: str, **kwargs: Any) -> None:
        record("revert", self.name, order)


class Pack(task.Task):
    default_provides = "parcel"

    def execute(self, order: str, receipt: str) -> str:
        record("execute", self.name, order)
        if os.environ.get("SHOP_BLOCK") == order:
            print(f"blocked {order}", flush=True)
            threading.Event().wait()
        return f"parcel-{receipt}"

    def revert(self, order: str, **kwargs: Any) -> None:
        record("revert", self.name, order)


class Ship(task.Task):
    default_provides = "tracking"

    def __init__(self, name: str, fail: bool) -> None:
        super().__init__(name)
        self.fail = fail

    def execute(self, order: str, parcel: str) -> str:
        record("execute", self.name, order)
        if self.fail:
            raise ShippingError(f"no carrier for {parcel}")
        return f"trk-{parcel}"

    def revert(self, order: str, **kwargs: Any) -> None:
        record("revert", self.name, order)


def make_order(fail_at: str = "") -> Any:
    """reserve -> pay (charge under a retry) -> pack -> ship."""
    return linear_flow.Flow("order").add(
        Reserve("reserve"),
        linear_flow.Flow("pay", retry=retry.Times(3, "pay-retry")).add(Charge("charge")),
        Pack("pack"),
        Ship("ship", fail=fail_at == "ship"),
    )
