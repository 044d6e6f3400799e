"""Cancelling requests that wait in a queue: the CANCEL message and a worker's revoked ids.

A suspending engine cannot take back a request it already published, and letting it run
unobserved would be a ghost. Instead it broadcasts a CANCEL naming the waiting attempts to every
flowengine worker (routing key ``flowengine.discover``, which only their private control queues
bind). A worker remembers the ids for a while and, when one of them reaches a task thread, answers
with an EVENT of type :data:`EVENT_CANCELLED` instead of running it. The engine then knows the
attempt never ran. A request a worker already started is not affected: the engine waits for its
outcome, as it waits for requests on TaskFlow workers, which never see a CANCEL.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from flowengine.worker_based.wire.control import ControlMessage

#: The ``type`` property of a CANCEL message (flowengine control queues only).
CANCEL = "CANCEL"
#: A worker's answer to a revoked request: RESPONSE state EVENT, details ``{"worker": id}``.
EVENT_CANCELLED = "flowengine.cancelled"
#: Seconds a worker remembers a revoked id (a request still queued after this is long past
#: any transition timeout, and its deadline header voids it anyway).
REVOKED_TTL = 3600.0
#: Most revoked ids a worker remembers; the oldest are forgotten first.
REVOKED_MAX = 10_000
#: Most ids one CANCEL may name.
MAX_IDS = 1_000


class Cancel(ControlMessage):
    """``{"request_ids": [...]}``: attempts (by request id) their engine no longer wants run."""

    TYPE = CANCEL
    SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "request_ids": {
                "type": "array",
                "items": {"type": "string", "maxLength": 128},
                "minItems": 1,
                "maxItems": MAX_IDS,
            },
        },
        "required": ["request_ids"],
        "additionalProperties": False,
    }

    def __init__(self, request_ids: Iterable[str]) -> None:
        self.request_ids = list(request_ids)

    def to_dict(self) -> dict[str, Any]:
        """The body."""
        return {"request_ids": list(self.request_ids)}


class Revoked:
    """Request ids a worker was asked not to run, forgotten after ``ttl`` seconds.

    Args:
        ttl: Seconds an id is remembered.
        limit: Most ids remembered; adding more forgets the oldest.
        clock: Monotonic clock in seconds (injected by tests).
    """

    def __init__(self, ttl: float = REVOKED_TTL, limit: int = REVOKED_MAX,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl, self._limit, self._clock = ttl, limit, clock
        self._until: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, request_ids: Iterable[str]) -> None:
        """Remember ``request_ids`` as revoked."""
        until = self._clock() + self._ttl
        with self._lock:
            for request_id in request_ids:
                self._until[request_id] = until
                self._until.move_to_end(request_id)
            while len(self._until) > self._limit:
                self._until.popitem(last=False)

    def take(self, request_id: Any) -> bool:
        """Whether ``request_id`` was revoked (and still remembered); it is forgotten then.

        Anything but a non-empty string (a header from the network) was never revoked.
        """
        if not isinstance(request_id, str) or not request_id:
            return False
        with self._lock:
            until = self._until.pop(request_id, None)
        return until is not None and until >= self._clock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._until)
