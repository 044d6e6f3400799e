"""A backend that keeps records in this process's memory (lost when the process exits).

Useful for tests and for flows that never need resuming. Records are stored as copies, so
changing a model after saving it does not change what is stored, and loading returns new objects.
When each state was entered (the details' ``times``) and the flows' fencing tokens are kept in
tables of their own beside the records, so the records, and the tree TaskFlow programs walk
(``MemoryBackend.memory``), are TaskFlow's exactly.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

from flowengine.persistence import _codec, base, models
from flowengine.persistence._store import RecordStore, Session, Skip, StoreConnection, decode_all
from flowengine.persistence.backends._memory_tree import FakeFilesystem, MemoryTree

__all__ = ["FakeFilesystem", "MemoryBackend"]


_MISSING = object()


class _Tables:
    """The records, as JSON-friendly dicts, which record contains which, their times, and the
    flows' fencing tokens."""

    def __init__(self) -> None:
        self.books: dict[str, Any] = {}
        self.flows: dict[str, Any] = {}
        self.atoms: dict[str, Any] = {}
        # Children as dicts used as ordered sets, so they keep the order they were added in.
        self.book_flows: dict[str, Any] = {}
        self.flow_atoms: dict[str, Any] = {}
        # Flow and atom details' times by uuid (a flow or atom without any has no entry).
        self.flow_times: dict[str, Any] = {}
        self.atom_times: dict[str, Any] = {}
        # Flow details' fencing tokens by uuid (a flow never written under a claim has none).
        self.flow_tokens: dict[str, int] = {}

    def all(self) -> tuple[dict[str, Any], ...]:
        return (self.books, self.flows, self.atoms, self.book_flows, self.flow_atoms,
                self.flow_times, self.atom_times, self.flow_tokens)


class _MemorySession(Session):
    """A transaction: every change is logged so a failed write can be undone."""

    def __init__(self, tables: _Tables, copier: Callable[[Any], Any], where: str) -> None:
        self._t = tables
        self._copy = copier
        self._where = where
        self._undo: list[tuple[dict[str, Any], str, Any]] = []

    def rollback(self) -> None:
        for table, key, old in reversed(self._undo):
            if old is _MISSING:
                table.pop(key, None)
            else:
                table[key] = old
        self._undo.clear()

    def _set(self, table: dict[str, Any], key: str, value: Any) -> None:
        self._undo.append((table, key, table.get(key, _MISSING)))
        table[key] = value

    def _pop(self, table: dict[str, Any], key: str) -> Any:
        old = table.get(key, _MISSING)
        if old is not _MISSING:
            self._undo.append((table, key, old))
            del table[key]
        return {} if old is _MISSING else old

    def _link(self, table: dict[str, Any], parent: str, child: str) -> None:
        children = table.get(parent, {})
        if child not in children:
            # Replaced, never changed in place, so the undo log can restore the old one.
            self._set(table, parent, {**children, child: None})

    def get_book(self, uuid: str) -> models.LogBook | None:
        data = self._t.books.get(uuid)
        return None if data is None else _codec.decode_book(self._where, uuid, self._copy(data))

    def get_flow(self, uuid: str) -> models.FlowDetail | None:
        data = self._t.flows.get(uuid)
        if data is None:
            return None
        fd = _codec.decode_flow(self._where, uuid, self._copy(data))
        fd.times = dict(self._t.flow_times.get(uuid, {}))
        fd.fencing_token = self._t.flow_tokens.get(uuid)
        return fd

    def get_atom(self, uuid: str) -> models.AtomDetail | None:
        data = self._t.atoms.get(uuid)
        if data is None:
            return None
        ad = _codec.decode_atom(self._where, uuid, self._copy(data))
        ad.times = dict(self._t.atom_times.get(uuid, {}))
        return ad

    def books(self, skip: Skip = None) -> list[models.LogBook]:
        return decode_all(list(self._t.books), self.get_book, skip)

    def flows_of(self, book_uuid: str, skip: Skip = None) -> list[models.FlowDetail]:
        return decode_all(list(self._t.book_flows.get(book_uuid, {})), self.get_flow, skip)

    def atoms_of(self, flow_uuid: str) -> list[models.AtomDetail]:
        uuids = self._t.flow_atoms.get(flow_uuid, {})
        return [ad for uuid in uuids if (ad := self.get_atom(uuid)) is not None]

    def put_book(self, book: models.LogBook, new: bool) -> None:
        self._set(self._t.books, book.uuid, self._copy(_codec.book_record(book)))

    def put_flow(self, fd: models.FlowDetail, book_uuid: str | None, new: bool) -> None:
        self._set(self._t.flows, fd.uuid, self._copy(_codec.flow_record(fd)))
        self._set_times(self._t.flow_times, fd.uuid, fd.times)
        if fd.fencing_token is not None:
            self._set(self._t.flow_tokens, fd.uuid, fd.fencing_token)
        if book_uuid is not None:
            self._link(self._t.book_flows, book_uuid, fd.uuid)

    def put_atom(self, ad: models.AtomDetail, flow_uuid: str | None, new: bool) -> None:
        self._set(self._t.atoms, ad.uuid, self._copy(_codec.atom_record(ad)))
        self._set_times(self._t.atom_times, ad.uuid, ad.times)
        if flow_uuid is not None:
            self._link(self._t.flow_atoms, flow_uuid, ad.uuid)

    def fencing_token(self, flow_uuid: str) -> int | None:
        return self._t.flow_tokens.get(flow_uuid)

    def set_fencing_token(self, flow_uuid: str, token: int) -> None:
        if flow_uuid in self._t.flows:
            self._set(self._t.flow_tokens, flow_uuid, token)

    def holds_atom(self, flow_uuid: str, atom_uuid: str) -> bool:
        return atom_uuid in self._t.flow_atoms.get(flow_uuid, {})

    def _set_times(self, table: dict[str, Any], uuid: str, times: dict[str, float]) -> None:
        if times:
            self._set(table, uuid, dict(times))
        else:
            self._pop(table, uuid)

    def delete_book(self, uuid: str) -> None:
        self._pop(self._t.books, uuid)
        for flow_uuid in self._pop(self._t.book_flows, uuid):
            self._pop(self._t.flows, flow_uuid)
            self._pop(self._t.flow_times, flow_uuid)
            self._pop(self._t.flow_tokens, flow_uuid)
            for atom_uuid in self._pop(self._t.flow_atoms, flow_uuid):
                self._pop(self._t.atoms, atom_uuid)
                self._pop(self._t.atom_times, atom_uuid)

    def clear(self) -> None:
        for table in self._t.all():
            for key in list(table):
                self._pop(table, key)


class _MemoryStore(RecordStore):
    def __init__(self, deep_copy: bool) -> None:
        self.description = f"memory backend {id(self):#x}"
        self.tables = _Tables()
        self._copy: Callable[[Any], Any] = copy.deepcopy if deep_copy else copy.copy
        # One lock for readers and writers: every operation is a few dict lookups.
        self.lock = threading.RLock()

    @contextlib.contextmanager
    def session(self, write: bool) -> Iterator[Session]:
        with self.lock:
            session = _MemorySession(self.tables, self._copy, self.description)
            try:
                yield session
            except BaseException:
                session.rollback()
                raise


class MemoryBackend(base.Backend):
    """Keeps logbooks in memory; each backend object has its own, empty, store.

    Configuration keys:

    * ``deep_copy`` (default ``True``): store and return deep copies of results and metadata.
      With ``False`` only the records are copied, so result objects are shared with the caller.

    Args:
        conf: The configuration, or ``None``.
    """

    def __init__(self, conf: dict[str, Any] | None = None) -> None:
        super().__init__(conf)
        deep_copy = self._conf.get("deep_copy", True)
        if isinstance(deep_copy, str):
            deep_copy = deep_copy.strip().lower() in ("1", "true", "yes", "on")
        self._store = _MemoryStore(bool(deep_copy))
        store = self._store
        #: The records as TaskFlow's in-memory filesystem (read only).
        self.memory = MemoryTree(lambda: store.tables, lambda: store.lock)

    def get_connection(self) -> base.Connection:
        """Return a connection to this backend's memory."""
        return StoreConnection(self, self._store)

    def close(self) -> None:
        """Nothing to release; the records stay until this backend is garbage collected."""
