"""A persistence backend whose writes pass a :class:`~.claims.ClaimFence` first, and carry
the claim's fencing token to the store.

The engine running a job gets this wrapper instead of the conductor's backend, so that every
record it stores (an atom's RUNNING state before dispatch, its result, the flow's state) is
refused once the conductor may have lost the job's claim: by the fence's clock before the write,
and by the store itself when a newer claim has written to the flow
(:mod:`flowengine.persistence.fencing`), which covers a conductor frozen between the two. Reads
pass through.

The fence is looked at again once a write returns. A conductor that was slow between its first
look and the write may have lost the claim meanwhile, with no newer claim having written yet:
the caller is told the claim is gone as if the write had been refused, so that nothing follows
it. The engine writes an atom's RUNNING state before it sends the atom's request; without the
second look, a conductor that woke past its claim sent a request of a job another conductor
had finished (a chaos run saw the task run again).
"""

from __future__ import annotations

import contextlib
from typing import Any

from flowengine.conductors.claims import ClaimFence
from flowengine.persistence import base

__all__ = ["FencedBackend"]

# What a connection does without writing. Everything else it offers is taken for a write and
# fenced: a write method added to a backend is fenced without anyone listing it here (a listed
# set of writes once missed change_flow_meta), and a read missing here costs a clock check.
_READS = frozenset({"backend", "description", "close", "validate", "layout", "reach", "fenced"})


def _writes(name: str) -> bool:
    return not (name.startswith(("get_", "_")) or name in _READS)


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
        if not callable(attribute) or not _writes(name):
            return attribute
        fence = self._fence

        def fenced(*args: Any, **kwargs: Any) -> Any:
            record = args[0] if args else None
            what = f"{name.replace('_', ' ')} {getattr(record, 'name', '')!r}".strip()
            fence.check(what)
            try:
                written = attribute(*args, **kwargs)
            except base.FencedOff as err:
                # The store has seen a newer claim's write: this one is certainly over.
                fence.lose(f"a newer claim of the job wrote to its flow ({err})")
                raise
            fence.check(what)  # still held once it landed: else nothing may follow it
            return written

        return fenced


class FencedBackend:
    """Wraps ``backend`` so that its connections' writes check ``fence`` first and, given the
    job's flow, are made under the claim's fencing token.

    Args:
        backend: The conductor's persistence backend (not closed by this wrapper).
        fence: The job's claim fence (its ``token``: the claim's fencing token, if any).
        flow_uuid: The flow detail the job runs (None: writes carry no token).
    """

    def __init__(self, backend: base.Backend, fence: ClaimFence,
                 flow_uuid: str | None = None) -> None:
        self._backend = backend
        self._fence = fence
        self._flow_uuid = flow_uuid

    def _connect(self) -> tuple[base.Connection, bool]:
        """A connection to the backend, and whether its writes carry the claim's token."""
        connection = self._backend.get_connection()
        token, flow_uuid = self._fence.token, self._flow_uuid
        if token is None or flow_uuid is None:
            return connection, False
        # A backend that takes no token (base.Connection.fenced: None) is fenced by the clock alone.
        fenced = connection.fenced(flow_uuid, token)
        if fenced is None:
            return connection, False
        return fenced, True

    def get_connection(self) -> Any:
        """A connection whose writes are fenced."""
        return _FencedConnection(self._connect()[0], self._fence, self)

    def record_fencing_token(self) -> None:
        """Record the claim's fencing token on the job's flow: a conductor's first write after
        it claims the job, before it loads the flow. Nothing to record when the board gave no
        token or the backend takes none (its writes are then fenced by the clock alone).

        Raises:
            FencedOff: The claim may have lapsed, or a newer claim has written to the flow.
        """
        connection, carries = self._connect()
        with contextlib.closing(_FencedConnection(connection, self._fence, self)) as fenced:
            if carries:
                fenced.record_fencing_token()

    def close(self) -> None:
        """Nothing: the wrapped backend belongs to the conductor."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
