"""A persistence backend whose writes pass a :class:`~.claims.ClaimFence` first.

The engine running a job gets this wrapper instead of the conductor's backend, so that every
record it stores (an atom's RUNNING state before dispatch, its result, the flow's state) is
refused once the conductor may have lost the job's claim. Reads pass through.

The fence is looked at again once a write returns. A conductor frozen (or just slow) between the
first look and the write may have lost the claim meanwhile: its write has landed, stale, and
cannot be taken back by this check, but the caller is told the claim is gone as if the write
had been refused, so that nothing follows it. The engine writes an atom's RUNNING state before
it sends the atom's request; without the second look, a conductor that woke past its claim sent
a request of a job another conductor had finished (a chaos run saw the task run again).
"""

from __future__ import annotations

from typing import Any

from flowengine.conductors.claims import ClaimFence
from flowengine.persistence import base

__all__ = ["FencedBackend"]

_WRITES = frozenset({"update_atom_details", "update_flow_details", "update_flow_fields",
                     "save_logbook", "destroy_logbook", "clear_all"})


class _FencedConnection:
    def __init__(self, connection: base.Connection, fence: ClaimFence,
                 backend: FencedBackend) -> None:
        self._connection = connection
        self._fence = fence
        self._backend = backend

    @property
    def backend(self) -> FencedBackend:
        return self._backend

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._connection, name)
        if name not in _WRITES:
            return attribute
        fence = self._fence

        def fenced(record: Any = None, *args: Any, **kwargs: Any) -> Any:
            what = f"{name.replace('_', ' ')} {getattr(record, 'name', '')!r}".strip()
            fence.check(what)
            written = attribute(*(() if record is None else (record,)), *args, **kwargs)
            fence.check(what)  # still held once it landed: else nothing may follow it
            return written

        return fenced


class FencedBackend:
    """Wraps ``backend`` so that its connections' writes check ``fence`` first.

    Args:
        backend: The conductor's persistence backend (not closed by this wrapper).
        fence: The job's claim fence.
    """

    def __init__(self, backend: base.Backend, fence: ClaimFence) -> None:
        self._backend = backend
        self._fence = fence

    def get_connection(self) -> Any:
        """A connection whose writes are fenced."""
        return _FencedConnection(self._backend.get_connection(), self._fence, self)

    def close(self) -> None:
        """Nothing: the wrapped backend belongs to the conductor."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
