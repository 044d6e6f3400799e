"""Keys the engines write into atom and flow details' ``meta``, for the tools that read them.

Kept apart from the engines so ``flowengine flows``/``show`` and the dashboard read stored
records without importing an engine (its graph library and schemas). When each state was
entered is not kept in ``meta``: see :mod:`flowengine.persistence.state_times`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Retry meta key: when (seconds since the epoch) its next attempt is due, while it waits.
META_RETRY_DUE = "retry_due"
#: Task meta key: when (seconds since the epoch) the request of a task dispatched with a
#: delay may be taken by a worker (a retried subflow's first tasks on a worker-based engine).
META_DELAYED_UNTIL = "delayed_until"

#: Atom metadata key: what a task waits for (key, kind, limit, position, holders), while it
#: waits for a lock or a concurrency limit (see flowengine.engines.admission).
META_WAITING = "waiting_for"
#: Flow metadata key: the locks a run holds, and what it waits for, while it runs.
META_COORDINATION = "coordination"
#: Progress details key a worker holding a request for a concurrency limit reports it under
#: (see flowengine.worker_based.worker_side.limits).
PROGRESS_WAITING = "waiting_for"


def waiting_of(atom_meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a stored atom waits for (a lock or limit), from its metadata: the engine's own
    wait, or its worker's (reported as progress details); None when it waits for nothing."""
    waiting = atom_meta.get(META_WAITING)
    if isinstance(waiting, dict):
        return waiting
    progress = atom_meta.get("progress_details")
    details = progress.get("details") if isinstance(progress, dict) else None
    remote = details.get(PROGRESS_WAITING) if isinstance(details, dict) else None
    return remote if isinstance(remote, dict) else None


def describe_wait(waiting: Mapping[str, Any]) -> str:
    """``lock 'lb:1' (held by ...)`` / ``limit 'RebootHost' 3 at once (held by ...)``."""
    kind, key, limit = waiting.get("kind") or "lock", waiting.get("key"), waiting.get("limit")
    what = f"{kind} {key!r}" + (f" {limit} at once" if kind == "limit" else "")
    holders = waiting.get("holders") or []
    return what + (f" (held by {'; '.join(map(str, holders))})" if holders else "")
