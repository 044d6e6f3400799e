"""Tasks of the TaskFlow interoperability tests, one module for both libraries.

Engines and workers match tasks by wire name (``interop_tasks.Reserve``), so an engine of one
library and a worker of the other must both import this module. ``INTEROP_TASK_LIBRARY``
(``taskflow`` or ``flowengine``, the default) picks the base class, as a migration does by
renaming one import; the class bodies are the same for both.

Every execute and revert is appended to the JSON-lines file named by ``INTEROP_LEDGER``, with
the library and process that ran it.
"""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any

LIBRARY = os.environ.get("INTEROP_TASK_LIBRARY", "flowengine")
if LIBRARY == "taskflow":
    from taskflow import task
elif LIBRARY == "flowengine":
    from flowengine import task  # type: ignore[no-redef]
else:
    raise ImportError(f"INTEROP_TASK_LIBRARY must be taskflow or flowengine, not {LIBRARY!r}")


def record(event: str, atom: str, **data: Any) -> None:
    """Append one entry to the shared ledger."""
    entry = {"event": event, "atom": atom, "library": LIBRARY, "pid": os.getpid(), **data}
    with open(os.environ["INTEROP_LEDGER"], "a", encoding="utf-8") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        ledger.write(json.dumps(entry, default=repr) + "\n")


def summary(value: Any) -> Any:
    """A JSON view of a revert's ``result`` (a Failure becomes what it says)."""
    if hasattr(value, "exception_str") and hasattr(value, "check"):
        return {"failure": value.exception_str, "types": list(value)}
    return value


def failures(flow_failures: Any) -> dict[str, str]:
    return {name: f.exception_str for name, f in sorted((flow_failures or {}).items())}


class ShippingError(RuntimeError):
    """What ``Ship`` raises when told to fail."""


class Reserve(task.Task):
    """Reserves stock; reports progress half way."""

    def execute(self, item: str, quantity: int) -> dict[str, Any]:
        record("execute", self.name, item=item, quantity=quantity)
        self.update_progress(0.5)
        return {"id": f"rsv-{item}-{quantity}", "quantity": quantity}

    def revert(self, item: str, quantity: int, result: Any = None, flow_failures: Any = None,
               **kwargs: Any) -> None:
        record("revert", self.name, result=summary(result), failures=failures(flow_failures))


class Charge(task.Task):
    """Charges for a reservation."""

    def execute(self, reservation: dict[str, Any], price: float) -> str:
        record("execute", self.name, reservation=reservation)
        return f"rcpt-{reservation['id']}-{price * reservation['quantity']:.2f}"

    def revert(self, reservation: dict[str, Any], price: float, result: Any = None,
               flow_failures: Any = None, **kwargs: Any) -> None:
        record("revert", self.name, result=summary(result), failures=failures(flow_failures))


class Ship(task.Task):
    """Ships a paid order, or raises :class:`ShippingError` when ``fail`` is true."""

    def execute(self, receipt: str, fail: bool) -> str:
        record("execute", self.name, receipt=receipt)
        if fail:
            raise ShippingError(f"cannot ship {receipt}")
        return f"trk-{receipt}"

    def revert(self, receipt: str, fail: bool, result: Any = None, flow_failures: Any = None,
               **kwargs: Any) -> None:
        record("revert", self.name, result=summary(result), failures=failures(flow_failures))


class Nested(task.Task):
    """Returns a list nested ``depth`` levels deep (deeper than the wire allows, if asked)."""

    def execute(self, depth: int) -> Any:
        record("execute", self.name, depth=depth)
        value: Any = []
        for _ in range(depth - 1):
            value = [value]
        return value
