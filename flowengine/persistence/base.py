"""The persistence backend and connection interfaces, and the errors backends raise.

A :class:`Backend` is built from a configuration dict (usually by
:func:`flowengine.persistence.backends.fetch`) and hands out :class:`Connection` objects that
save and load :mod:`~flowengine.persistence.models` records. Names and semantics are TaskFlow's.

Every backend raises :class:`~flowengine.exceptions.NotFound` for a missing record and a
:class:`~flowengine.exceptions.StorageFailure` (usually its subclass
:class:`~flowengine.exceptions.BackendError`) for anything else; messages name the backend (with
any password masked) and the record's uuid.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

from flowengine import exceptions as exc
from flowengine.persistence import models

__all__ = ["Backend", "Connection", "CorruptRecord", "FencedOff", "IncompatibleSchema"]


class CorruptRecord(exc.StorageFailure):
    """A stored record cannot be decoded: damaged, truncated, or written by something else.

    Args:
        message: What is wrong, naming the backend and the record.
        backend: The backend's description (secrets masked).
        kind: ``logbook``, ``flow detail`` or ``atom detail``.
        uuid: The record's uuid.
        cause: The decoding error, if any.
    """

    def __init__(
        self,
        message: str,
        backend: str = "",
        kind: str = "",
        uuid: str = "",
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message, cause=cause)
        self.backend = backend
        self.kind = kind
        self.uuid = uuid


class FencedOff(exc.StorageFailure):
    """A write made under a claim (or a lease) its writer may no longer hold was refused.

    Refused before the write by the writer's own fence (its lease clock says the claim may
    have ended: :mod:`flowengine.conductors.claims`), or by the store itself, which has seen a
    write to the flow under a newer claim's fencing token (:mod:`flowengine.persistence.fencing`).
    An engine halts on it without reverting anything: the work is another owner's now.
    """


class IncompatibleSchema(exc.BackendError, exc.IncompatibleVersion):
    """A database's schema cannot be used by this version of flowengine.

    Raised when the schema is newer than the code knows (written by a later flowengine), or when
    the tables were created by something else. Catchable as
    :class:`~flowengine.exceptions.StorageFailure` and as
    :class:`~flowengine.exceptions.IncompatibleVersion`.
    """


class Backend(metaclass=abc.ABCMeta):
    """A place logbooks are stored, configured by a dict.

    Args:
        conf: The configuration (``None`` means an empty one).

    Raises:
        TypeError: If ``conf`` is neither ``None`` nor a dict.
    """

    def __init__(self, conf: dict[str, Any] | None) -> None:
        if not conf:
            conf = {}
        if not isinstance(conf, dict):
            raise TypeError(f"Configuration dictionary expected, not '{conf}' ({type(conf)})")
        self._conf = conf

    @abc.abstractmethod
    def get_connection(self) -> Connection:
        """Return a new connection to this backend."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what this backend holds open (pools, files)."""


class Connection(metaclass=abc.ABCMeta):
    """Saves and loads logbooks, flow details and atom details.

    Saving merges: a record that already exists is merged with the one given (see the models'
    ``merge`` methods) and the merged, stored version is returned.
    """

    @property
    @abc.abstractmethod
    def backend(self) -> Backend:
        """The backend this connection belongs to."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what this connection holds open."""

    @abc.abstractmethod
    def upgrade(self) -> None:
        """Create or migrate the backend's storage to the layout this code uses."""

    @abc.abstractmethod
    def clear_all(self) -> None:
        """Delete every logbook, flow detail and atom detail."""

    @abc.abstractmethod
    def validate(self) -> None:
        """Check the backend is usable; raise a :class:`~flowengine.exceptions.StorageFailure`
        saying why when it is not."""

    @abc.abstractmethod
    def update_atom_details(self, atom_detail: models.AtomDetail) -> models.AtomDetail:
        """Merge ``atom_detail`` into its stored version, save and return the result.

        Raises:
            flowengine.exceptions.NotFound: If it was never saved (save its flow detail first).
        """

    @abc.abstractmethod
    def update_flow_details(
        self, flow_detail: models.FlowDetail, ignore_missing: bool = False
    ) -> models.FlowDetail:
        """Merge ``flow_detail`` and its atom details into storage; return the stored version.

        Atom details not stored yet are added to the flow detail.

        Raises:
            flowengine.exceptions.NotFound: If it was never saved (save its logbook first), unless
                ``ignore_missing``, which stores it in no logbook.
        """

    @abc.abstractmethod
    def save_logbook(self, book: models.LogBook) -> models.LogBook:
        """Save ``book`` with all its flow and atom details; return the stored version."""

    @abc.abstractmethod
    def destroy_logbook(self, book_uuid: str) -> None:
        """Delete a logbook with its flow and atom details.

        Raises:
            flowengine.exceptions.NotFound: If there is no such logbook.
        """

    @abc.abstractmethod
    def get_logbook(self, book_uuid: str, lazy: bool = False) -> models.LogBook:
        """Return a stored logbook; with ``lazy`` its flow details are not loaded.

        Raises:
            flowengine.exceptions.NotFound: If there is no such logbook.
        """

    @abc.abstractmethod
    def get_logbooks(self, lazy: bool = False) -> Iterable[models.LogBook]:
        """Return every stored logbook; with ``lazy`` their flow details are not loaded."""

    @abc.abstractmethod
    def get_flows_for_book(self, book_uuid: str, lazy: bool = False) -> Iterable[models.FlowDetail]:
        """Return the flow details of a logbook; with ``lazy`` their atoms are not loaded.

        Raises:
            flowengine.exceptions.NotFound: If there is no such logbook.
        """

    @abc.abstractmethod
    def get_flow_details(self, fd_uuid: str, lazy: bool = False) -> models.FlowDetail:
        """Return a stored flow detail; with ``lazy`` its atom details are not loaded.

        Raises:
            flowengine.exceptions.NotFound: If there is no such flow detail.
        """

    @abc.abstractmethod
    def get_atom_details(self, ad_uuid: str) -> models.AtomDetail:
        """Return a stored atom detail.

        Raises:
            flowengine.exceptions.NotFound: If there is no such atom detail.
        """

    @abc.abstractmethod
    def get_atoms_for_flow(self, fd_uuid: str) -> Iterable[models.AtomDetail]:
        """Return the atom details of a flow detail.

        Raises:
            flowengine.exceptions.NotFound: If there is no such flow detail.
        """

    def fenced(self, flow_uuid: str, token: int) -> Connection | None:
        """A connection to the same store whose writes are made under a claim with fencing
        token ``token`` on flow detail ``flow_uuid`` (a flowengine addition; see
        :mod:`flowengine.persistence.fencing`), or None if this backend cannot refuse a stale
        claim's writes itself (the default: a conductor then fences them by its clock alone).

        The connection returned refuses, with :class:`FencedOff`, a write to the flow or its
        atoms once the flow was written under a greater token, and any write outside the flow;
        its ``record_fencing_token()`` records the token before anything else is written.
        """
        return None
