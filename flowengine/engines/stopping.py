"""Cancelling a flow and bounding it with a deadline: the request and what is stored of it.

A cancel (``engine.cancel``, ``flowengine cancel``, the dashboard, an expired deadline) asks a
running flow to stop and undo its work: what has not started is revoked, running tasks are asked
to stop (:mod:`flowengine.context`), then every completed atom is reverted in reverse order and
the flow ends ``REVERTED``. The engine applies it on its own thread (:meth:`RunLoop.cancel
<flowengine.engines.machine.RunLoop.cancel>`) and records who asked, when and why in the flow
detail's meta (:data:`META_CANCELLED`), so ``flowengine show``, the dashboard and a resumed run
all know the flow was cancelled.

A deadline (engine option ``deadline``, in seconds) is stored in the flow detail's meta
(:data:`META_DEADLINE`) as an absolute time, by the engine's clock, when the flow first runs: a
resumed flow keeps it. When it expires the engine cancels the flow with reason
:data:`DEADLINE_REASON`.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CancelRequest", "DEADLINE_REASON", "META_CANCELLED", "META_DEADLINE",
           "deadline_seconds"]

#: Flow detail meta of a cancelled flow: ``{"reason", "by", "at"}`` (``at``: ISO time, UTC).
META_CANCELLED = "cancelled"
#: Flow detail meta of a flow with a deadline: ``{"at": epoch seconds, "seconds": given}``.
META_DEADLINE = "deadline"
#: The reason of a cancel an expired deadline made (and who made it).
DEADLINE_REASON = "deadline"
#: The engine option naming the deadline.
OPTION = "deadline"


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True)
class CancelRequest:
    """One request to cancel a flow.

    Attributes:
        reason: Why, as given (shown with the flow).
        by: Who asked (``"engine.cancel"``, ``"flowengine cancel"``, ``"dashboard"``...).
        at: When, ISO 8601 in UTC to the second.
    """

    reason: str
    by: str
    at: str

    @classmethod
    def now(cls, reason: str, by: str,
            clock: Callable[[], datetime.datetime] = _utc_now) -> CancelRequest:
        """A request made now.

        Raises:
            ValueError: ``reason`` or ``by`` is empty or not a string.
        """
        for name, value in (("reason", reason), ("by", by)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"A cancel needs a non-empty {name} (a string), got {value!r}")
        return cls(reason.strip(), by.strip(), clock().isoformat(timespec="seconds"))

    @classmethod
    def from_record(cls, record: object) -> CancelRequest | None:
        """The request a stored :data:`META_CANCELLED` record (or request) holds, if it is one."""
        if not isinstance(record, Mapping) or not isinstance(record.get("reason"), str):
            return None
        return cls(str(record["reason"]), str(record.get("by") or "?"),
                   str(record.get("at") or "?"))

    def record(self) -> dict[str, str]:
        """What is stored of it."""
        return {"reason": self.reason, "by": self.by, "at": self.at}

    def __str__(self) -> str:
        return f"cancelled by {self.by} at {self.at}: {self.reason}"


def deadline_seconds(value: Any) -> float | None:
    """The ``deadline`` engine option's ``value``, validated (None: no deadline).

    Raises:
        ValueError: It is not a number of seconds above zero.
    """
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Engine option 'deadline' must be a number of seconds, got "
                         f"{value!r}") from None
    if isinstance(value, bool) or not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"Engine option 'deadline' must be a number of seconds above zero, "
                         f"got {value!r}")
    return seconds


def stored_deadline(meta: Mapping[str, Any]) -> float | None:
    """When a flow's stored deadline expires (epoch seconds by the engine's clock), if it has
    one."""
    record = meta.get(META_DEADLINE)
    at = record.get("at") if isinstance(record, Mapping) else None
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return float(at)
    return None
