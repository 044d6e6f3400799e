"""What a worker reads off a request: event fields, limits, and bounded text for its logs.

Message fields are untrusted, so everything here copes with missing, oversized or mistyped
values instead of raising.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

from flowengine.types.failure import Failure
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker.delivery import Delivery


def make_worker_id() -> str:
    """A worker id unique across hosts, processes and restarts: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def event_fields(data: Mapping[str, Any], message: Delivery) -> dict[str, Any]:
    """The identifying fields of a request's events (from its body and headers)."""
    headers = message.headers or {}
    return {
        "flow_uuid": headers.get(pr.HEADER_FLOW_UUID)
        or (message.properties or {}).get("reply_to"),
        "atom_uuid": headers.get(pr.HEADER_ATOM_UUID),
        "task_name": data.get("task_name"),
        "request_id": headers.get(pr.HEADER_REQUEST_ID)
        or (message.properties or {}).get("correlation_id"),
        "attempt": headers.get(pr.HEADER_ATTEMPT),
        "action": data.get("action"),
    }


def clip(value: Any, limit: int = 200) -> str:
    """``str(value)``, cut to ``limit`` characters (message fields are untrusted)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def first(failure: Failure) -> str | None:
    """The first exception type name of ``failure`` (None if it names none)."""
    names = list(failure)
    return str(names[0]) if names else None


#: Shortest heartbeat interval a request may ask for, in seconds.
MIN_HEARTBEAT_INTERVAL = 0.01


def time_limit(headers: Mapping[str, Any]) -> float | None:
    """The time limit a request asks for, in seconds (None: none, or not a positive number)."""
    value = headers.get(pr.HEADER_TIME_LIMIT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)


def heartbeat_interval(headers: Mapping[str, Any]) -> float | None:
    """The heartbeat interval a request asks for (at least MIN_HEARTBEAT_INTERVAL), or None."""
    value = headers.get(ext.HEADER_HEARTBEAT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return max(float(value), MIN_HEARTBEAT_INTERVAL)


def quiet_start(headers: Mapping[str, Any]) -> bool:
    """Whether the engine that sent a request takes its outcome without a RUNNING reply first
    (flowengine protocol 2 and later; never a TaskFlow engine)."""
    value = headers.get(pr.HEADER_PROTOCOL)
    return (isinstance(value, int) and not isinstance(value, bool)
            and value >= pr.QUIET_START_PROTOCOL)


def running_after(headers: Mapping[str, Any], interval: float | None) -> float:
    """Seconds a quietly started request runs before its worker says RUNNING: the short
    threshold, no later than its first heartbeat would be, nor than half the time left before
    its deadline (its engine must hear of it before it would give up on it)."""
    after = ext.RUNNING_AFTER if interval is None else min(ext.RUNNING_AFTER, interval)
    deadline = headers.get(pr.HEADER_DEADLINE)
    if isinstance(deadline, (int, float)) and not isinstance(deadline, bool):
        after = min(after, max((deadline - time.time()) / 2, 0.0))
    return after
