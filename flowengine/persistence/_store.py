"""The one implementation of TaskFlow's connection semantics, over a small record-store seam.

Every backend (memory, directory, SQL) provides a :class:`RecordStore`: transactions
(:class:`Session`) that get, list, put and delete single records. :class:`StoreConnection` holds
what saving means (merging with what is stored, which records must exist, what is returned) and
how failures are reported, so the backends cannot drift apart.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from flowengine import exceptions as exc
from flowengine.persistence import base, models
from flowengine.persistence._codec import ATOM, BOOK, FLOW
from flowengine.persistence.fencing import Fence

LOG = logging.getLogger(__name__)

_R = TypeVar("_R")
_K = TypeVar("_K")
_M = TypeVar("_M")

#: Where a listing hands a damaged record it leaves out (None: the listing raises instead).
Skip = Callable[[base.CorruptRecord], None] | None


def decode_all(keys: Iterable[_K], decode: Callable[[_K], _M | None], skip: Skip) -> list[_M]:
    """Decode each key's record, dropping ``None`` s; a damaged one raises, or goes to ``skip``."""
    found: list[_M] = []
    for key in keys:
        try:
            model = decode(key)
        except base.CorruptRecord as err:
            if skip is None:
                raise
            skip(err)
            continue
        if model is not None:
            found.append(model)
    return found

# A write that lost a race (two writers inserting one record) is retried this many times in all.
_WRITE_ATTEMPTS = 3


class Session(abc.ABC):
    """One transaction against a store; records are models, decoded and checked by the store."""

    @abc.abstractmethod
    def get_book(self, uuid: str) -> models.LogBook | None:
        """Return the logbook (without flows) or ``None``."""

    @abc.abstractmethod
    def get_flow(self, uuid: str) -> models.FlowDetail | None:
        """Return the flow detail (without atoms) or ``None``."""

    @abc.abstractmethod
    def get_atom(self, uuid: str) -> models.AtomDetail | None:
        """Return the atom detail or ``None``."""

    @abc.abstractmethod
    def books(self, skip: Skip = None) -> list[models.LogBook]:
        """Return every logbook (without flows).

        With ``skip``, a damaged record is handed to it and left out instead of raising.
        """

    @abc.abstractmethod
    def flows_of(self, book_uuid: str, skip: Skip = None) -> list[models.FlowDetail]:
        """Return the flow details (without atoms) of a logbook (``skip`` as for books)."""

    @abc.abstractmethod
    def atoms_of(self, flow_uuid: str) -> list[models.AtomDetail]:
        """Return the atom details of a flow detail."""

    def atoms_by_flow(self, flow_uuids: list[str]) -> dict[str, list[models.AtomDetail]]:
        """Return the atom details of several flow details (stores may do it in one query)."""
        return {uuid: self.atoms_of(uuid) for uuid in flow_uuids}

    @abc.abstractmethod
    def put_book(self, book: models.LogBook, new: bool) -> None:
        """Insert (``new``) or overwrite a logbook record."""

    @abc.abstractmethod
    def put_flow(self, fd: models.FlowDetail, book_uuid: str | None, new: bool) -> None:
        """Insert a flow detail into a logbook (``new``) or overwrite its record."""

    @abc.abstractmethod
    def put_atom(self, ad: models.AtomDetail, flow_uuid: str | None, new: bool) -> None:
        """Insert an atom detail into a flow detail (``new``) or overwrite its record."""

    def insert_atoms(self, ads: list[models.AtomDetail], flow_uuid: str) -> None:
        """Insert new atom details into a flow detail (stores may do it in one statement)."""
        for ad in ads:
            self.put_atom(ad, flow_uuid, new=True)

    def fencing_token(self, flow_uuid: str) -> int | None:
        """The greatest fencing token written to a flow detail (None: none, or no such flow);
        read for a write, so the flow cannot change before this transaction ends (stores may
        read it alone)."""
        fd = self.get_flow(flow_uuid)
        return None if fd is None else fd.fencing_token

    def set_fencing_token(self, flow_uuid: str, token: int) -> None:
        """Record ``token`` as a flow detail's greatest fencing token (nothing if there is no
        such flow; stores may write it alone)."""
        fd = self.get_flow(flow_uuid)
        if fd is not None:
            fd.fencing_token = token
            self.put_flow(fd, None, new=False)

    def holds_atom(self, flow_uuid: str, atom_uuid: str) -> bool:
        """Whether the atom detail is one of the flow detail's (stores may look it up alone)."""
        return any(ad.uuid == atom_uuid for ad in self.atoms_of(flow_uuid))

    def replace_atom_of(self, flow_uuid: str, ad: models.AtomDetail) -> bool | None:
        """Overwrite ``ad``'s record in this transaction if it is one of the flow detail's, in
        one statement: True if done, False if the flow holds no such atom. ``None`` (the
        default) means the store has no such shortcut. The fenced twin of
        :meth:`RecordStore.replace_atom` (overwriting equals merging for a whole AtomDetail).
        """
        return None

    @abc.abstractmethod
    def delete_book(self, uuid: str) -> None:
        """Delete a logbook and everything in it."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Delete every record."""


@dataclasses.dataclass(frozen=True)
class LayoutStatus:
    """Where a store's layout stands against the one this flowengine uses.

    Attributes:
        backend: Names the backend (``sqlalchemy backend 'sqlite:///x.db'``), secrets masked.
        version: The schema version stored (SQL); ``None`` where the layout has no version.
        latest: The schema version this flowengine uses; ``None`` where there is none.
        pending: What an upgrade would do, one step each, in order (none: the layout is current).
    """

    backend: str
    version: int | None = None
    latest: int | None = None
    pending: tuple[str, ...] = ()

    @property
    def current(self) -> bool:
        """Whether the store can be used as it is."""
        return not self.pending


class RecordStore(abc.ABC):
    """Where a backend keeps records.

    Attributes:
        description: Names the backend in messages (``dir backend '/var/lib/x'``), secrets masked.
    """

    description: str = "backend"

    @abc.abstractmethod
    def session(self, write: bool) -> contextlib.AbstractContextManager[Session]:
        """Open a transaction; ``write`` ones exclude other writers until they end."""

    def upgrade(self) -> list[str]:
        """Create or migrate the storage layout; return what was done, one step each (none
        when it was current, and by default)."""
        return []

    def layout(self) -> LayoutStatus:
        """Where the storage layout stands (current, by default).

        Raises:
            IncompatibleSchema: If the store cannot be used by this flowengine at all (newer,
                or made by another program); the message says what to run.
        """
        return LayoutStatus(self.description)

    def reach(self) -> None:
        """Raise if the store cannot be reached at all (nothing by default); the layout is
        checked when it is first used."""
        return None

    def validate(self) -> None:
        """Raise if the store cannot be used (nothing by default)."""
        return None

    def mask(self, text: str) -> str:
        """Return ``text`` with any secret the store knows replaced by ``***``."""
        return text

    def is_conflict(self, err: BaseException) -> bool:
        """Return whether ``err`` means a concurrent writer won a race worth retrying."""
        return False

    def replace_atom(self, ad: models.AtomDetail) -> bool | None:
        """Overwrite a stored atom in one atomic step: True if done, False if it does not exist.

        The hot path of every atom state change, so it runs outside :meth:`session` when the
        store can do it in one statement. ``None`` (the default) means the store has no such
        shortcut. Overwriting equals merging when ``ad`` is complete, which every AtomDetail is.
        """
        return None


def _changed(before: object, after: object) -> bool:
    try:
        return before != after
    except Exception:
        # Some results (arrays, for one) refuse a truth value for ==; write them to be safe.
        return True


def _attach_flows(book: models.LogBook, flows: Iterable[models.FlowDetail]) -> None:
    # LogBook.add stamps updated_at; loading what is stored must not change that record.
    updated_at = book.updated_at
    for fd in flows:
        book.add(fd)
    book.updated_at = updated_at


class StoreConnection(base.Connection):
    """A :class:`~flowengine.persistence.base.Connection` over a :class:`RecordStore`.

    Args:
        backend: The backend that made this connection.
        store: Where the records are.
        fence: The claim its writes are made under (None: none; see :meth:`fenced`).
    """

    def __init__(self, backend: base.Backend, store: RecordStore,
                 fence: Fence | None = None) -> None:
        self._backend = backend
        self._store = store
        self._fence = fence

    def fenced(self, flow_uuid: str, token: int) -> StoreConnection:
        """A connection to the same store whose writes are made under a claim whose fencing
        token is ``token`` (a flowengine addition; see :mod:`flowengine.persistence.fencing`).

        Each of its writes is refused (:class:`~flowengine.persistence.base.FencedOff`) if
        the flow detail ``flow_uuid`` was written under a greater token, and records ``token``
        as the flow's greatest otherwise, in the same transaction; a write of anything outside
        that flow (another flow, an atom of another flow) is refused too.
        """
        return StoreConnection(self._backend, self._store, Fence(flow_uuid, token))

    def record_fencing_token(self) -> None:
        """Record this connection's fencing token on its flow detail, or raise
        :class:`~flowengine.persistence.base.FencedOff` if a greater one is there: a
        conductor's first write after it claims a job (a flowengine addition).

        Raises:
            ValueError: If the connection is not :meth:`fenced`.
        """
        fence = self._fence
        if fence is None:
            raise ValueError(f"{self._store.description}: this connection writes under no claim,"
                             f" so it has no fencing token to record")
        self._run(f"recording claim token {fence.token} on {FLOW} '{fence.flow_uuid}'", True,
                  lambda s: None)

    def _fenced_flow(self, fd_uuid: str | None, what: str) -> None:
        """Refuse a write of ``what`` to anything but the fenced flow detail (``fd_uuid``
        None: a logbook, or every record)."""
        if self._fence is not None and fd_uuid != self._fence.flow_uuid:
            raise self._fence.outside(what, self._store.description)

    @property
    def backend(self) -> base.Backend:
        """The backend this connection belongs to."""
        return self._backend

    @property
    def description(self) -> str:
        """How messages name the backend (``dir backend '/var/lib/x'``), secrets masked."""
        return self._store.description

    def close(self) -> None:
        """Nothing to release: the backend owns every resource."""

    def _run(self, what: str, write: bool, work: Callable[[Session], _R]) -> _R:
        store = self._store
        fence = self._fence if write else None
        for attempt in range(1, _WRITE_ATTEMPTS + 1):
            try:
                with store.session(write) as session:
                    if fence is not None:  # the check and the write: one transaction
                        fence.enforce(session, what, store.description)
                    return work(session)
            except (exc.TaskFlowException, builtins.NotImplementedError):
                raise
            except Exception as err:
                if write and attempt < _WRITE_ATTEMPTS and store.is_conflict(err):
                    LOG.debug("%s: %s lost a race, retrying", store.description, what)
                    continue
                message = f"{store.description}: {what} failed: {store.mask(str(err))}"
                raise exc.BackendError(message, cause=err) from err
        raise AssertionError("unreachable: the last attempt returns or raises")

    def upgrade(self) -> None:
        """Create or migrate the backend's storage layout."""
        self.upgrade_layout()

    def upgrade_layout(self) -> list[str]:
        """Create or migrate the backend's storage layout; return what was done, one step each.

        A flowengine addition (what ``flowengine db upgrade`` reports); idempotent: nothing is
        done, and nothing returned, when the layout is current.
        """
        return self._guard("upgrading the storage layout", self._store.upgrade)

    def layout(self) -> LayoutStatus:
        """Where the backend's storage layout stands (``flowengine db status``)."""
        return self._guard("reading the storage layout", self._store.layout)

    def reach(self) -> None:
        """Raise a :class:`~flowengine.exceptions.StorageFailure` if the backend cannot be
        reached (the layout is checked when first used, or by :meth:`validate`)."""
        self._guard("connecting", self._store.reach)

    def validate(self) -> None:
        """Raise a :class:`~flowengine.exceptions.StorageFailure` if the backend is unusable."""
        self._guard("connecting", self._store.validate)

    def _guard(self, what: str, call: Callable[[], _R]) -> _R:
        try:
            return call()
        except exc.TaskFlowException:
            raise
        except Exception as err:
            message = f"{self._store.description}: {what} failed: {self._store.mask(str(err))}"
            raise exc.BackendError(message, cause=err) from err

    def clear_all(self) -> None:
        """Delete every logbook, flow detail and atom detail."""
        self._fenced_flow(None, "clearing all records")
        self._run("clearing all records", True, lambda s: s.clear())

    def save_logbook(self, book: models.LogBook) -> models.LogBook:
        """Save ``book`` with its flow and atom details; return the stored, merged version."""

        def save(s: Session) -> models.LogBook:
            stored = s.get_book(book.uuid)
            if stored is None:
                s.put_book(book, new=True)
                merged = book
            else:
                merged = stored.merge(book)
                s.put_book(merged, new=False)
                _attach_flows(merged, self._populate(s, s.flows_of(book.uuid)))
            _attach_flows(merged, [self._save_flow(s, fd, book.uuid) for fd in book])
            return merged

        self._fenced_flow(None, f"saving {BOOK} '{book.uuid}'")
        return self._run(f"saving {BOOK} '{book.uuid}'", True, save)

    def update_flow_details(
        self, flow_detail: models.FlowDetail, ignore_missing: bool = False
    ) -> models.FlowDetail:
        """Merge ``flow_detail`` and its atom details into storage; return the stored version.

        With ``ignore_missing`` (TaskFlow's memory and file backends have it) a flow detail never
        saved is stored in no logbook, instead of raising NotFound.
        """
        what = f"updating {FLOW} '{flow_detail.uuid}' (flow {flow_detail.name!r})"
        self._fenced_flow(flow_detail.uuid, what)
        return self._run(
            what, True, lambda s: self._save_flow(s, flow_detail, None, ignore_missing))

    def update_flow_fields(self, flow_detail: models.FlowDetail) -> None:
        """Store the flow detail's own fields (name, state, meta), leaving its atoms alone.

        A flowengine addition: a flow state change then costs one write, not one per atom.
        """

        def save(s: Session) -> None:
            stored = s.get_flow(flow_detail.uuid)
            if stored is None:
                raise exc.NotFound(
                    f"{self._store.description}: no {FLOW} with uuid '{flow_detail.uuid}'")
            s.put_flow(stored.merge(flow_detail), None, new=False)

        what = f"updating {FLOW} '{flow_detail.uuid}' (flow {flow_detail.name!r})"
        self._fenced_flow(flow_detail.uuid, what)
        self._run(what, True, save)

    def change_flow_meta(self, fd_uuid: str,
                         change: Callable[[models.FlowDetail], None]) -> models.FlowDetail:
        """Change a stored flow detail's meta in one write transaction; return it as stored.

        A flowengine addition for processes that do not run the flow (an operator's suspend
        request): ``change`` sees the stored flow detail (without atoms), may raise to leave it
        alone, and changes its ``meta``; nothing the engine running the flow wrote in the
        meantime is overwritten, as a read then a separate save could do.

        Raises:
            flowengine.exceptions.NotFound: If there is no such flow detail.
        """

        def save(s: Session) -> models.FlowDetail:
            stored = s.get_flow(fd_uuid)
            if stored is None:
                raise exc.NotFound(f"{self._store.description}: no {FLOW} with uuid '{fd_uuid}'")
            change(stored)
            s.put_flow(stored, None, new=False)
            return stored

        what = f"changing the meta of {FLOW} '{fd_uuid}'"
        self._fenced_flow(fd_uuid, what)
        return self._run(what, True, save)

    def _save_flow(
        self, s: Session, fd: models.FlowDetail, book_uuid: str | None,
        ignore_missing: bool = False,
    ) -> models.FlowDetail:
        stored = s.get_flow(fd.uuid)
        if stored is None:
            if book_uuid is None and not ignore_missing:
                raise exc.NotFound(f"{self._store.description}: no {FLOW} with uuid '{fd.uuid}'")
            s.put_flow(fd, book_uuid, new=True)
            s.insert_atoms(list(fd), fd.uuid)
            return fd
        merged = stored.merge(fd)
        s.put_flow(merged, book_uuid, new=False)
        existing = {ad.uuid: ad for ad in s.atoms_of(fd.uuid)}
        added: list[models.AtomDetail] = []
        for ad in fd:
            current = existing.get(ad.uuid)
            if current is None:
                added.append(ad)
                existing[ad.uuid] = ad
                continue
            before = (current.to_dict(), dict(current.times))
            current.merge(ad)
            # Rewriting every unchanged atom on each flow update costs a write per atom.
            if _changed(before, (current.to_dict(), current.times)):
                s.put_atom(current, fd.uuid, new=False)
        # All at once: an engine adds every atom of its flow in one update.
        s.insert_atoms(added, fd.uuid)
        for ad in existing.values():
            merged.add(ad)
        return merged

    def update_atom_details(self, atom_detail: models.AtomDetail) -> models.AtomDetail:
        """Merge ``atom_detail`` into its stored version, save it and return the result."""
        what = f"updating {ATOM} '{atom_detail.uuid}' (atom {atom_detail.name!r})"
        fence = self._fence
        replaced = None
        if fence is None:
            # The hot path of every state change: one statement, no session, where the store
            # can. A fenced write needs its flow's token checked in the same transaction.
            replaced = self._guard(what, lambda: self._store.replace_atom(atom_detail))
            if replaced:
                return atom_detail

        def update(s: Session) -> models.AtomDetail:
            # Fenced: the flow's token is checked in this transaction; then, where the store
            # can, the atom is overwritten in one statement, as on the unfenced path. A miss
            # (no such atom, or another flow's) takes the long way, which says which.
            if fence is not None and s.replace_atom_of(fence.flow_uuid, atom_detail):
                return atom_detail
            stored = None if replaced is False else s.get_atom(atom_detail.uuid)
            if stored is None:
                raise exc.NotFound(
                    f"{self._store.description}: no {ATOM} with uuid '{atom_detail.uuid}'"
                )
            if fence is not None and not s.holds_atom(fence.flow_uuid, atom_detail.uuid):
                raise fence.outside(what, self._store.description)
            stored.merge(atom_detail)
            s.put_atom(stored, None, new=False)
            return stored

        return self._run(what, True, update)

    def destroy_logbook(self, book_uuid: str) -> None:
        """Delete a logbook with its flow and atom details."""

        def destroy(s: Session) -> None:
            self._need_book(s, book_uuid)
            s.delete_book(book_uuid)

        self._fenced_flow(None, f"destroying {BOOK} '{book_uuid}'")
        self._run(f"destroying {BOOK} '{book_uuid}'", True, destroy)

    def _need_book(self, s: Session, uuid: str) -> models.LogBook:
        book = s.get_book(uuid)
        if book is None:
            raise exc.NotFound(f"{self._store.description}: no {BOOK} with uuid '{uuid}'")
        return book

    def _need_flow(self, s: Session, uuid: str) -> models.FlowDetail:
        fd = s.get_flow(uuid)
        if fd is None:
            raise exc.NotFound(f"{self._store.description}: no {FLOW} with uuid '{uuid}'")
        return fd

    @staticmethod
    def _populate(s: Session, flows: list[models.FlowDetail]) -> list[models.FlowDetail]:
        atoms = s.atoms_by_flow([fd.uuid for fd in flows])
        for fd in flows:
            for ad in atoms.get(fd.uuid, ()):
                fd.add(ad)
        return flows

    @staticmethod
    def _left_out(
        err: base.CorruptRecord, flow_uuid: str | None = None, book_uuid: str | None = None
    ) -> None:
        kind, uuid = (FLOW, flow_uuid) if flow_uuid else (err.kind, err.uuid)
        where = f" of {BOOK} '{book_uuid}'" if book_uuid else ""
        LOG.error("get_logbooks() leaves out %s '%s'%s: %s", kind, uuid, where, err)

    def _populate_intact(
        self, s: Session, flows: list[models.FlowDetail],
        left_out: Callable[..., None],
    ) -> list[models.FlowDetail]:
        """Populate flows with their atoms, leaving out (and reporting) those with a damaged one."""
        try:
            return self._populate(s, flows)
        except base.CorruptRecord:
            pass  # rare: find the flows holding damaged atoms one flow at a time
        intact = []
        for fd in flows:
            try:
                atoms = s.atoms_of(fd.uuid)
            except base.CorruptRecord as err:
                left_out(err, flow_uuid=fd.uuid)
                continue
            for ad in atoms:
                fd.add(ad)
            intact.append(fd)
        return intact

    def get_logbook(self, book_uuid: str, lazy: bool = False) -> models.LogBook:
        """Return a stored logbook; with ``lazy`` its flow details are not loaded."""

        def load(s: Session) -> models.LogBook:
            book = self._need_book(s, book_uuid)
            if not lazy:
                _attach_flows(book, self._populate(s, s.flows_of(book_uuid)))
            return book

        return self._run(f"loading {BOOK} '{book_uuid}'", False, load)

    def get_logbooks(self, lazy: bool = False) -> Iterable[models.LogBook]:
        """Return every stored logbook; with ``lazy`` their flow details are not loaded.

        One damaged record does not hide every other logbook (TaskFlow raises here): a logbook
        whose own record is damaged is left out, and so is a flow detail whose record or any of
        whose atom details' records is damaged; never returned with atoms missing, since a
        resumed engine would run those again. Each is logged as an error naming it and the
        damaged record; ``get_logbook`` and ``get_flow_details`` still raise for it.
        """

        def load(s: Session) -> list[models.LogBook]:
            books = s.books(skip=self._left_out)
            if not lazy:
                for book in books:
                    left_out = functools.partial(self._left_out, book_uuid=book.uuid)
                    flows = s.flows_of(book.uuid, skip=left_out)
                    _attach_flows(book, self._populate_intact(s, flows, left_out))
            return books

        # Loaded inside one transaction, then handed out: no transaction stays open meanwhile.
        return iter(self._run("loading all logbooks", False, load))

    def get_flows_for_book(self, book_uuid: str, lazy: bool = False) -> Iterable[models.FlowDetail]:
        """Return the flow details of a logbook; with ``lazy`` their atoms are not loaded."""

        def load(s: Session) -> list[models.FlowDetail]:
            self._need_book(s, book_uuid)
            flows = s.flows_of(book_uuid)
            return flows if lazy else self._populate(s, flows)

        return iter(self._run(f"loading the flow details of {BOOK} '{book_uuid}'", False, load))

    def get_flow_details(self, fd_uuid: str, lazy: bool = False) -> models.FlowDetail:
        """Return a stored flow detail; with ``lazy`` its atom details are not loaded."""

        def load(s: Session) -> models.FlowDetail:
            fd = self._need_flow(s, fd_uuid)
            return fd if lazy else self._populate(s, [fd])[0]

        return self._run(f"loading {FLOW} '{fd_uuid}'", False, load)

    def get_atom_details(self, ad_uuid: str) -> models.AtomDetail:
        """Return a stored atom detail."""

        def load(s: Session) -> models.AtomDetail:
            ad = s.get_atom(ad_uuid)
            if ad is None:
                raise exc.NotFound(f"{self._store.description}: no {ATOM} with uuid '{ad_uuid}'")
            return ad

        return self._run(f"loading {ATOM} '{ad_uuid}'", False, load)

    def get_atoms_for_flow(self, fd_uuid: str) -> Iterable[models.AtomDetail]:
        """Return the atom details of a flow detail."""

        def load(s: Session) -> list[models.AtomDetail]:
            self._need_flow(s, fd_uuid)
            return s.atoms_of(fd_uuid)

        return iter(self._run(f"loading the atom details of {FLOW} '{fd_uuid}'", False, load))
