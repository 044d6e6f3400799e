"""When each flow and atom entered each state: how the stored times are read back.

Every engine (serial, parallel, worker-based; run from service code, by a conductor or by
``flowengine run``) records when the flow and each atom entered each state, in the same write as
the state itself: ``times`` of the flow and atom details (``{state: seconds since the epoch}``
of each state's last entry). ``times`` is a flowengine field of the models, outside ``meta`` and
outside ``to_dict()``, so a TaskFlow program reading the records sees exactly what it sees on
TaskFlow; each backend keeps it in a place of its own (SQL: a ``times`` column; dir: a ``times``
key beside the record in its file; memory: a table beside its records).

Records written before the times had a field of their own kept them in ``meta`` under
``'<STATE>-timestamp'`` (the keys TaskFlow's ``EventTimeListener`` writes, which a listener may
still write): :func:`entered` reads those too, so older stores and TaskFlow stores keep their
timings. What a flow's "updated" time is, everywhere it is shown (``flowengine flows``, ``show``,
the dashboard), is defined here (:func:`updated`).

Kept apart from the engines so ``flowengine flows``/``show`` and the dashboard read stored
records without importing an engine.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Protocol

from flowengine import states

__all__ = ["LEGACY_SUFFIX", "entered", "first_entry", "recorded", "updated"]

#: Suffix of the ``meta`` keys older records (and TaskFlow's ``EventTimeListener``) hold times
#: under: ``'RUNNING-timestamp'``.
LEGACY_SUFFIX = "-timestamp"


class Timed(Protocol):
    """A flow or atom detail: its ``meta`` and its ``times``."""

    meta: dict[str, Any]
    times: dict[str, float]


def _is_time(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def recorded(value: Any) -> dict[str, float]:
    """The ``times`` a backend read back, as a fresh dict: anything that is not a mapping of
    state names to numbers (a damaged or hand-edited record) is left out, never raised on,
    since a lost time is not worth losing the record for."""
    if not isinstance(value, Mapping):
        return {}
    return {state: float(when) for state, when in value.items()
            if isinstance(state, str) and _is_time(when)}


def _legacy(meta: Mapping[str, Any]) -> dict[str, float]:
    if not isinstance(meta, Mapping):
        return {}
    return {key[: -len(LEGACY_SUFFIX)]: float(value) for key, value in meta.items()
            if isinstance(key, str) and key.endswith(LEGACY_SUFFIX) and _is_time(value)}


def entered(detail: Timed) -> dict[str, float]:
    """``{state: seconds since the epoch}`` of when ``detail`` last entered each state.

    Its ``times``, completed by the ``'<STATE>-timestamp'`` keys of its ``meta`` (records
    written before ``times`` existed, TaskFlow's, or a timing listener's), ``times`` winning.
    """
    return {**_legacy(detail.meta), **recorded(detail.times)}


def first_entry(detail: Timed) -> float | None:
    """When ``detail`` first left ``PENDING`` as far as the record tells (the earliest time it
    holds of any other state); None for one that never ran. Orders atoms as they ran."""
    return min((when for state, when in entered(detail).items() if state != states.PENDING),
               default=None)


def updated(flow: Timed, stored: datetime.datetime | None = None) -> float | None:
    """A flow's "updated" time (seconds since the epoch): its last recorded state change.

    The same everywhere it is shown (``flowengine flows``, ``show``, the dashboard's list and
    flow pages; the SQL backend writes it as the flow row's ``updated_at``). A flow with no
    recorded state change (written by TaskFlow, or saved and never run) falls back to
    ``stored``: when its logbook was last written (naive UTC).
    """
    last = max(entered(flow).values(), default=None)
    if last is not None:
        return last
    return None if stored is None else stored.replace(tzinfo=datetime.UTC).timestamp()
