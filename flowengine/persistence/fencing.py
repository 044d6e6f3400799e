"""Fencing tokens: the store refuses a write made under an older claim than one it has seen.

A conductor checks its claim on a job by its own lease clock before each write of the job's
progress (:mod:`flowengine.conductors.claims`), but a check by the writer cannot cover the
moment between the check and the write: a conductor frozen there (SIGSTOP, a paused virtual
machine) makes its write when it wakes, after another conductor has taken the job over and
moved it on. So the store checks too, as Kleppmann's "How to do distributed locking" has it:
every claim of a job comes with a *fencing token* from the jobboard, greater than every earlier
claim's (:meth:`flowengine.jobs.base.JobBoard.claim`), and the store refuses a write to a flow
(its flow detail or any of its atom details) made under a smaller token than the greatest it
has seen for that flow, with :class:`~flowengine.persistence.base.FencedOff`.

A conductor's engine writes through a connection made by
:meth:`~flowengine.persistence._store.StoreConnection.fenced` (the flow and the claim's token);
its first write after claiming records the token on the flow, before it loads what is stored,
so everything the previous owner wrote before that is what it resumes from, and everything the
previous owner tries to write after it is refused. The check and the write are one transaction
(SQL: the flow's row is locked, ``SELECT ... FOR UPDATE``; dir: under the directory's
exclusive lock; memory: under its lock), so they cannot be interleaved with a newer claim's.

The greatest token is the flow detail's :attr:`~flowengine.persistence.models.FlowDetail.
fencing_token`, kept outside ``meta`` and outside TaskFlow's ``to_dict()`` keys (SQL: a
``fencing_token`` column; dir: a ``fencing_token`` key beside the record in its file; memory: a
table beside its records), as the state times are: TaskFlow programs reading the records see
exactly what they see on TaskFlow. Writes made without a token (plain engines,
``flowengine run``, an operator's commands) are never refused, and never lower it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from flowengine.persistence.base import FencedOff

__all__ = ["Fence", "FencedOff", "recorded"]


class TokenSession(Protocol):
    """What :meth:`Fence.enforce` needs of a write session."""

    def fencing_token(self, flow_uuid: str) -> int | None:
        """The greatest token written to the flow (None: none, or no such flow)."""

    def set_fencing_token(self, flow_uuid: str, token: int) -> None:
        """Record ``token`` as the flow's greatest."""


def recorded(value: Any) -> int | None:
    """A fencing token as a backend read it back: an integer, or None for anything else (a
    record written before tokens existed, or damaged)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclasses.dataclass(frozen=True)
class Fence:
    """The claim a connection's writes are made under.

    Attributes:
        flow_uuid: The flow detail the claim's job runs (the only flow the writes may change).
        token: The claim's fencing token.
    """

    flow_uuid: str
    token: int

    def enforce(self, session: TokenSession, what: str, where: str) -> None:
        """In a write transaction, before the write of ``what``: refuse it if the flow was
        written under a greater token; record this token as the flow's greatest if it is.

        Raises:
            FencedOff: A newer claim has written to the flow; the message names the backend,
                the write, the flow and both tokens.
        """
        stored = session.fencing_token(self.flow_uuid)
        if stored is not None and stored > self.token:
            raise FencedOff(
                f"{where}: refused {what}: flow detail '{self.flow_uuid}' was written "
                f"under claim token {stored}, newer than this write's {self.token} (another "
                f"conductor claimed its job since)")
        if stored is None or stored < self.token:
            session.set_fencing_token(self.flow_uuid, self.token)

    def outside(self, what: str, where: str) -> FencedOff:
        """The refusal of a write of ``what``, which is not part of the fenced flow."""
        return FencedOff(f"{where}: refused {what}: it is not part of flow detail "
                         f"'{self.flow_uuid}', the one flow these writes (under claim token "
                         f"{self.token}) may change")
