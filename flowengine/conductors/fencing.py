"""A persistence backend whose writes pass a :class:`~.claims.ClaimFence` first.

The engine running a job gets this wrapper instead of the conductor's backend, so that every
record it stores (an atom's RUNNING state before dispatch, its result, the flow's state) is
refused once the conductor may have lost the job's claim. Reads pass through.
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
            fence.check(f"{name.replace('_', ' ')} {getattr(record, 'name', '')!r}".strip())
            return attribute(*(() if record is None else (record,)), *args, **kwargs)

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
