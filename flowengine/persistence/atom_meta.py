"""Keys the engines write into ``meta`` of atom and flow details, for the tools that read them.

Every engine records when each flow and atom state change happened, as TaskFlow's
``EventTimeListener`` does (``'<STATE>-timestamp'``, seconds since the epoch), in the same
write as the state itself: ``flowengine show`` and the dashboard tell when each atom started and
how long it took for flows run anywhere (service code, conductors, ``flowengine run``). What a
flow's "updated" time is, everywhere it is shown, is defined here (:func:`flow_updated`).

Kept apart from the engines so ``flowengine flows``/``show`` and the dashboard read stored
records without importing an engine (its graph library and schemas).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

#: Retry meta key: when (seconds since the epoch) its next attempt is due, while it waits.
META_RETRY_DUE = "retry_due"
#: Task meta key: when (seconds since the epoch) the request of a task dispatched with a
#: delay may be taken by a worker (a retried subflow's first tasks on a worker-based engine).
META_DELAYED_UNTIL = "delayed_until"
#: Suffix of the meta key holding when a state was last entered (TaskFlow's name).
STAMP_SUFFIX = "-timestamp"


def stamp_key(state: str) -> str:
    """The meta key of when ``state`` was last entered."""
    return f"{state}{STAMP_SUFFIX}"


def stamps(meta: Mapping[str, Any]) -> dict[str, float]:
    """``{state: seconds since the epoch}`` of the state changes recorded in ``meta``."""
    return {key[: -len(STAMP_SUFFIX)]: float(value) for key, value in meta.items()
            if key.endswith(STAMP_SUFFIX) and isinstance(value, int | float)
            and not isinstance(value, bool)}


def first_stamp(meta: Mapping[str, Any]) -> float | None:
    """When the first recorded state change in ``meta`` happened (None: none recorded)."""
    return min(stamps(meta).values(), default=None)


def flow_updated(flow_meta: Mapping[str, Any],
                 stored: datetime.datetime | None = None) -> float | None:
    """A flow's "updated" time (seconds since the epoch): its last recorded state change.

    The same everywhere it is shown (``flowengine flows``, ``show``, the dashboard's list and
    flow pages): flows whose records predate the engines' timestamps (or come from TaskFlow)
    fall back to ``stored``, the time the record itself was written (naive UTC).
    """
    last = max(stamps(flow_meta).values(), default=None)
    if last is not None:
        return last
    return None if stored is None else stored.replace(tzinfo=datetime.UTC).timestamp()

#: Atom metadata key: what a task waits for (key, kind, limit, position, holders), while it
#: waits for a lock or a concurrency limit (see flowengine.engines.admission).
META_WAITING = "waiting_for"
#: Flow metadata key: the locks a run holds, and what it waits for, while it runs.
META_COORDINATION = "coordination"
#: Progress details key a worker holding a request for a concurrency limit reports it under
#: (see flowengine.worker_based.limits).
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
