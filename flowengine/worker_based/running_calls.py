"""The calls a worker runs: the context each task gets, and stopping them when asked.

A remote task reads its :class:`~flowengine.context.TaskContext` as a local one does. The
engine sends what only it knows in headers (:func:`context_headers`: the flow's name, the
attempt, the flow's deadline; the flow uuid, atom uuid, request id and attempt number travel
already); the worker adds its own identity and a cancel signal of the request's own
(:func:`context_from`). A TaskFlow engine sends none of it: its tasks get what the worker knows.

When a flow is cancelled, its engine sends a STOP naming the requests still running to the
private control queue of the worker that holds each one (a flowengine worker names itself in its
RUNNING reply and in every heartbeat), and again with each heartbeat that request sends while
it runs: the stop reaches the task within about one heartbeat interval even if the first STOP
was lost. The worker sets the request's signal (:class:`RunningCalls`): a thread task sees its
``cancel_requested``, an ``async def`` one is interrupted at its next await. Either way the task
still answers with its outcome, which its engine then reverts. TaskFlow workers, which have no
control queue, are never sent one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from flowengine.context import CancelSignal, TaskContext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.wire.control import ControlMessage

LOG = logging.getLogger(__name__)

#: The ``type`` property of a STOP message (flowengine control queues only).
STOP = "STOP"
#: Request header: the flow's name (what a task's context says).
HEADER_FLOW_NAME = "x-flowengine-flow-name"
#: Request header: the attempt of the task's innermost retry controller (1 without one).
HEADER_CALL_ATTEMPT = "x-flowengine-call-attempt"
#: Request header: when the flow's deadline expires (epoch seconds), if it has one.
HEADER_FLOW_DEADLINE = "x-flowengine-flow-deadline"
#: Longest text a header value from the network may give a context.
_MAX_TEXT = 255
#: Most ids one STOP may name.
MAX_IDS = 1_000


class Stop(ControlMessage):
    """``{"request_ids": [...], "reason": ...}``: stop these running requests, their flow is
    being cancelled."""

    TYPE = STOP
    SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "request_ids": {"type": "array", "items": {"type": "string", "maxLength": 128},
                            "minItems": 1, "maxItems": MAX_IDS},
            "reason": {"type": "string", "maxLength": 1024},
        },
        "required": ["request_ids", "reason"],
        "additionalProperties": False,
    }

    def __init__(self, request_ids: Iterable[str], reason: str) -> None:
        self.request_ids = list(request_ids)
        self.reason = reason

    def to_dict(self) -> dict[str, Any]:
        """The body."""
        return {"request_ids": list(self.request_ids), "reason": self.reason}


def context_headers(ctx: TaskContext | None) -> dict[str, Any]:
    """The headers carrying what a worker cannot know of ``ctx`` (engine side)."""
    if ctx is None:
        return {}
    headers: dict[str, Any] = {HEADER_CALL_ATTEMPT: ctx.attempt}
    if ctx.flow_name is not None:
        headers[HEADER_FLOW_NAME] = ctx.flow_name
    if ctx.deadline is not None:
        headers[HEADER_FLOW_DEADLINE] = ctx.deadline
    return headers


def _text(value: Any) -> str | None:
    return value[:_MAX_TEXT] if isinstance(value, str) and value else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def context_from(headers: Mapping[str, Any], data: Mapping[str, Any], request_id: str,
                 worker: str, signal: CancelSignal) -> TaskContext:
    """The context of the request a worker is about to run (header values are untrusted:
    what is missing or mistyped is left out)."""
    action = data.get("action")
    return TaskContext(
        flow_uuid=_text(headers.get(pr.HEADER_FLOW_UUID)),
        flow_name=_text(headers.get(HEADER_FLOW_NAME)),
        atom_name=_text(data.get("task_name")),
        atom_uuid=_text(headers.get(pr.HEADER_ATOM_UUID)),
        action=action if action in (pr.EXECUTE, pr.REVERT) else None,
        attempt=_count(headers.get(HEADER_CALL_ATTEMPT)),
        request_id=_text(headers.get(pr.HEADER_REQUEST_ID)) or _text(request_id),
        request_attempt=_count(headers.get(pr.HEADER_ATTEMPT)),
        worker=worker, deadline=_number(headers.get(HEADER_FLOW_DEADLINE)),
        signal=signal)


class RunningCalls:
    """The cancel signals of the requests a worker runs now, by request id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._signals: dict[str, CancelSignal] = {}

    def start(self, request_id: str) -> CancelSignal:
        """A new signal for ``request_id``, which :meth:`stop` sets until :meth:`end`."""
        signal = CancelSignal()
        with self._lock:
            self._signals[request_id] = signal
        return signal

    def end(self, request_id: str) -> None:
        """``request_id`` finished: a STOP for it changes nothing any more."""
        with self._lock:
            self._signals.pop(request_id, None)

    def stop(self, request_ids: Iterable[str], reason: str) -> list[str]:
        """Ask these requests to stop; return the ids of those running here."""
        with self._lock:
            found = [(rid, self._signals[rid]) for rid in request_ids if rid in self._signals]
        for request_id, signal in found:
            if signal.request(reason):
                LOG.info("Asked request %s to stop: its flow is being cancelled (%s)",
                         request_id, reason)
        return [rid for rid, _signal in found]
