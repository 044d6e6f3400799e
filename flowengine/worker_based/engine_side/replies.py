"""What a worker's reply says about the attempt it answers, as a lifecycle event.

A RESPONSE is RUNNING, an outcome (SUCCESS or FAILURE) or an EVENT, and flowengine workers say
more through EVENTs of their own types (heartbeats, hand-backs, cancellations). :func:`read`
turns one into the :mod:`~flowengine.worker_based.engine_side.lifecycle` event it is, or into
:class:`Progress` for the task's notifier (progress, and a worker waiting for a limit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.engine_side import lifecycle as lc


@dataclasses.dataclass(frozen=True, slots=True)
class Progress:
    """A progress EVENT for the local task's notifier; ``waiting_for``: what its worker holds
    the request unstarted for (a concurrency limit; empty: no longer, it starts), None when
    it says nothing of that."""

    event_type: str
    details: dict[str, Any]
    waiting_for: Any


def read(data: Mapping[str, Any], headers: Mapping[str, Any]) -> lc.Event | Progress | None:
    """The event a **validated** RESPONSE body is (None: a state no reply should have).

    Raises:
        Exception: The body is valid by schema yet cannot be decoded (its failure dict).
    """
    state = data["state"]
    worker = headers.get(pr.HEADER_WORKER)
    if state in (pr.SUCCESS, pr.FAILURE):
        return lc.Finished(state, pr.Response.from_dict(data).data["result"])
    if state == pr.RUNNING:
        return lc.Started(worker, pr.HEADER_PROTOCOL in headers)
    if state != pr.EVENT:
        return None
    payload = data["data"]
    event_type, details = payload["event_type"], payload["details"]
    if event_type == ext.EVENT_HEARTBEAT:
        return lc.Beat(worker)
    if event_type == ext.EVENT_REDELIVERED:
        return lc.HandedBack(worker)
    if event_type == ext.EVENT_RETURNED:
        return lc.Returned(worker)
    if event_type == ext.EVENT_NOT_SERVED:
        return lc.NotServed(worker, details.get("version"))
    if event_type == cn.EVENT_CANCELLED:
        return lc.Dropped(worker)
    return Progress(event_type, details, details.get(ext.WAITING_FOR))
