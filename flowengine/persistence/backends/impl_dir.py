"""A backend that keeps each record in a JSON file under one directory.

The layout is TaskFlow's ``dir`` backend layout, so a directory TaskFlow wrote can be read::

    <path>/books/<book uuid>/metadata             the logbook record (JSON)
    <path>/books/<book uuid>/<flow uuid>          symlink: the book holds that flow detail
    <path>/flow_details/<flow uuid>/metadata      the flow detail record
    <path>/flow_details/<flow uuid>/<atom uuid>   symlink: the flow holds that atom detail
    <path>/atom_details/<atom uuid>/metadata      the atom detail record

When each state was entered (the details' ``times``) is written in the record's own file, under
a ``times`` key beside TaskFlow's keys: TaskFlow reads the keys it knows and ignores it. A flow's
fencing token (:mod:`flowengine.persistence.fencing`) goes beside them, under
``fencing_token``, checked and written under the directory's exclusive lock.

Several processes (and threads) may share a directory: every file is replaced atomically (a
temporary file, fsync, then ``os.replace``), so a reader never sees half a record, and each
operation holds an ``flock`` on ``<path>/.flowengine-lock`` (shared to read, exclusive to write),
so a read-merge-write is never interleaved with another writer's. The kernel drops the lock of a
process that dies, so a crash never leaves the directory locked; a live process that keeps it
(hung, stopped) makes others give up after ``lock_timeout`` seconds with an error naming it.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from flowengine import exceptions as exc
from flowengine.persistence import _codec, base, models
from flowengine.persistence._hints import upgrade_hint
from flowengine.persistence._store import (
    LayoutStatus,
    RecordStore,
    Session,
    Skip,
    StoreConnection,
    decode_all,
)
from flowengine.persistence.backends._uri import seconds_option

__all__ = ["DirBackend"]

LOG = logging.getLogger(__name__)

_M = TypeVar("_M")

_BOOKS, _FLOWS, _ATOMS = "books", "flow_details", "atom_details"
_RECORD = "metadata"
_LOCK = ".flowengine-lock"


#: Seconds an operation waits for another process's lock on the directory, by default.
_DEFAULT_LOCK_TIMEOUT = 30.0


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class _DirSession(Session):
    def __init__(self, store: _DirStore) -> None:
        self._store = store
        self._where = store.description

    def _dir(self, table: str, uuid: str | None = None) -> str:
        if uuid is None:
            return os.path.join(self._store.path, table)
        # The uuid becomes a path component: it must not be able to leave its table directory.
        if not uuid or uuid in (".", "..") or "/" in uuid or "\0" in uuid or uuid.startswith("."):
            raise ValueError(f"uuid {uuid!r} cannot be used as a file name")
        return os.path.join(self._store.path, table, uuid)

    def _read(
        self, table: str, kind: str, uuid: str, decode: Callable[[str, str, Any], _M]
    ) -> _M | None:
        path = os.path.join(self._dir(table, uuid), _RECORD)
        try:
            raw = self._store.file_cache.read(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        with _codec.decoding(self._where, kind, uuid):
            text = raw.decode(self._store.encoding)
        return decode(self._where, uuid, _codec.loads(text, self._where, kind, uuid))

    def _children(self, table: str, uuid: str) -> list[str]:
        folder = self._dir(table, uuid)
        try:
            names = sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [
            name
            for name in names
            if not name.startswith(".") and os.path.islink(os.path.join(folder, name))
        ]

    def _write(self, table: str, kind: str, uuid: str, record: dict[str, Any]) -> None:
        text = _codec.dumps(record, self._where, kind, uuid)
        folder = self._dir(table, uuid)
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".{_RECORD}.{uuidlib.uuid4().hex}.tmp")
        try:
            with open(temp, "wb") as stream:
                stream.write(text.encode(self._store.encoding))
                stream.flush()
                if self._store.fsync:
                    os.fsync(stream.fileno())
            os.replace(temp, os.path.join(folder, _RECORD))
            self._store.file_cache.forget(os.path.join(folder, _RECORD))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    def _link(self, parent_table: str, parent_uuid: str, child_table: str, child: str) -> None:
        # Written after the child's record, so a link never points at a missing record.
        link = os.path.join(self._dir(parent_table, parent_uuid), child)
        with contextlib.suppress(FileExistsError):
            os.symlink(os.path.join("..", "..", child_table, child), link)

    def get_book(self, uuid: str) -> models.LogBook | None:
        return self._read(_BOOKS, _codec.BOOK, uuid, _codec.decode_book)

    def get_flow(self, uuid: str) -> models.FlowDetail | None:
        return self._read(_FLOWS, _codec.FLOW, uuid, _codec.decode_flow)

    def get_atom(self, uuid: str) -> models.AtomDetail | None:
        return self._read(_ATOMS, _codec.ATOM, uuid, _codec.decode_atom)

    def books(self, skip: Skip = None) -> list[models.LogBook]:
        try:
            names = sorted(os.listdir(self._dir(_BOOKS)))
        except FileNotFoundError:
            return []
        return decode_all([n for n in names if not n.startswith(".")], self._listed_book, skip)

    def _listed_book(self, name: str) -> models.LogBook | None:
        book = self.get_book(name)
        if book is None:
            # A folder without a record: a writer died between mkdir and its first write.
            LOG.debug("%s: skipping logbook folder %r without a record", self._where, name)
        return book

    def flows_of(self, book_uuid: str, skip: Skip = None) -> list[models.FlowDetail]:
        uuids = self._children(_BOOKS, book_uuid)
        return decode_all(uuids, lambda uuid: self._need(self.get_flow(uuid), _codec.FLOW, uuid),
                          skip)

    def atoms_of(self, flow_uuid: str) -> list[models.AtomDetail]:
        uuids = self._children(_FLOWS, flow_uuid)
        return [self._need(self.get_atom(uuid), _codec.ATOM, uuid) for uuid in uuids]

    def _need(self, found: _M | None, kind: str, uuid: str) -> _M:
        if found is None:
            raise base.CorruptRecord(
                f"{self._where}: {kind} '{uuid}' is linked but its record is missing",
                backend=self._where,
                kind=kind,
                uuid=uuid,
            )
        return found

    def put_book(self, book: models.LogBook, new: bool) -> None:
        self._write(_BOOKS, _codec.BOOK, book.uuid, _codec.book_record(book))

    def put_flow(self, fd: models.FlowDetail, book_uuid: str | None, new: bool) -> None:
        record = _codec.with_fencing_token(_codec.with_times(_codec.flow_record(fd), fd.times),
                                           fd.fencing_token)
        self._write(_FLOWS, _codec.FLOW, fd.uuid, record)
        if book_uuid is not None:
            self._link(_BOOKS, book_uuid, _FLOWS, fd.uuid)

    def put_atom(self, ad: models.AtomDetail, flow_uuid: str | None, new: bool) -> None:
        record = _codec.with_times(_codec.atom_record(ad), ad.times)
        self._write(_ATOMS, _codec.ATOM, ad.uuid, record)
        if flow_uuid is not None:
            self._link(_FLOWS, flow_uuid, _ATOMS, ad.uuid)

    def holds_atom(self, flow_uuid: str, atom_uuid: str) -> bool:
        self._dir(_ATOMS, atom_uuid)  # refuses a uuid that is no file name
        return os.path.islink(os.path.join(self._dir(_FLOWS, flow_uuid), atom_uuid))

    def delete_book(self, uuid: str) -> None:
        # Hide the book first (one atomic rename), so a crash part-way leaves only unlinked files.
        doomed = os.path.join(self._dir(_BOOKS), f".deleting-{uuid}-{uuidlib.uuid4().hex}")
        os.rename(self._dir(_BOOKS, uuid), doomed)
        for flow_uuid in sorted(os.listdir(doomed)):
            if flow_uuid.startswith(".") or not os.path.islink(os.path.join(doomed, flow_uuid)):
                continue
            for atom_uuid in self._children(_FLOWS, flow_uuid):
                shutil.rmtree(self._dir(_ATOMS, atom_uuid), ignore_errors=True)
            shutil.rmtree(self._dir(_FLOWS, flow_uuid), ignore_errors=True)
        shutil.rmtree(doomed)

    def clear(self) -> None:
        for table in (_BOOKS, _FLOWS, _ATOMS):
            folder = self._dir(table)
            if os.path.isdir(folder):
                doomed = os.path.join(self._store.path, f".{table}.deleting-{uuidlib.uuid4().hex}")
                os.rename(folder, doomed)
                os.makedirs(folder)
                shutil.rmtree(doomed)


class FileCache(collections.OrderedDict[str, tuple[int, int, int, bytes]]):
    """Files' contents by path, each checked against the file's inode, mtime and size when read.

    TaskFlow's ``DirBackend.file_cache``: unbounded, or the ``max_cache_size`` most recently
    read files. A file another process changed is read again, so the cache is never stale.
    """

    def __init__(self, maxsize: int | None) -> None:
        super().__init__()
        self.maxsize = maxsize
        self._lock = threading.Lock()  # engines' threads read at once

    @property
    def currsize(self) -> int:
        """How many files are cached."""
        return len(self)

    def read(self, path: str) -> bytes:
        """The file's contents, from the cache when the file has not changed."""
        with open(path, "rb") as stream:
            stat = os.fstat(stream.fileno())
            with self._lock:
                cached = self.get(path)
                key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if cached is not None and cached[:3] == key:
                    self.move_to_end(path)
                    return cached[3]
            raw = stream.read()
        with self._lock:
            self[path] = (stat.st_ino, stat.st_mtime_ns, stat.st_size, raw)
            self.move_to_end(path)
            while self.maxsize is not None and len(self) > self.maxsize:
                self.popitem(last=False)
        return raw

    def forget(self, path: str) -> None:
        """Drop ``path`` (it was just rewritten)."""
        with self._lock:
            self.pop(path, None)


class _DirStore(RecordStore):
    def __init__(self, path: str, encoding: str, fsync: bool, lock_timeout: float,
                 file_cache: FileCache) -> None:
        self.file_cache = file_cache
        self.path = path
        self.encoding = encoding
        self.fsync = fsync
        self.lock_timeout = lock_timeout
        self.description = f"dir backend '{path}'"

    def _acquire(self, fd: int, lock_path: str, write: bool) -> None:
        """Take the flock, waiting at most ``lock_timeout`` seconds.

        ``flock`` itself can only wait forever or not at all, so a blocked caller retries the
        non-blocking form with a growing pause (1 ms up to 20 ms): a process that holds the lock
        for good (hung, stopped) then costs an error naming the lock instead of a hang.
        """
        mode = fcntl.LOCK_EX if write else fcntl.LOCK_SH
        deadline = time.monotonic() + self.lock_timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    kind = "exclusive" if write else "shared"
                    raise TimeoutError(
                        f"gave up after {self.lock_timeout:g}s waiting for the {kind} lock on"
                        f" '{lock_path}', held by another process (option 'lock_timeout')"
                    ) from None
                time.sleep(min(pause, remaining))
                pause = min(pause * 2, 0.02)

    @contextlib.contextmanager
    def _locked(self, write: bool) -> Iterator[None]:
        lock_path = os.path.join(self.path, _LOCK)
        if write:
            os.makedirs(self.path, exist_ok=True)
        fd: int | None = None
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            if write:
                raise
            with contextlib.suppress(OSError):
                fd = os.open(lock_path, os.O_RDONLY)
        if fd is None:
            # Nothing stored yet, or a directory this process cannot write and nobody has
            # written: each file is still replaced atomically, so reading without a lock is safe.
            yield
            return
        try:
            self._acquire(fd, lock_path, write)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    @contextlib.contextmanager
    def session(self, write: bool) -> Iterator[Session]:
        with self._locked(write):
            yield _DirSession(self)

    def _missing(self) -> list[str]:
        return [table for table in (_BOOKS, _FLOWS, _ATOMS)
                if not os.path.isdir(os.path.join(self.path, table))]

    def _half_deleted(self) -> list[str]:
        # Deletions a crashed process left half done (already hidden from readers).
        found: list[str] = []
        for folder in (self.path, os.path.join(self.path, _BOOKS)):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                found.extend(os.path.join(folder, name) for name in os.listdir(folder)
                             if name.startswith(".") and ".deleting-" in name)
        return found

    def _steps(self, missing: list[str], doomed: list[str]) -> list[str]:
        steps = []
        if missing:
            steps.append(f"create the folders {', '.join(missing)}")
        if doomed:
            steps.append(f"finish {len(doomed)} interrupted deletion(s)")
        return steps

    def upgrade(self) -> list[str]:
        with self._locked(True):
            missing, doomed = self._missing(), self._half_deleted()
            for table in missing:
                os.makedirs(os.path.join(self.path, table), exist_ok=True)
            for path in doomed:
                shutil.rmtree(path, ignore_errors=True)
        return self._steps(missing, doomed)

    def layout(self) -> LayoutStatus:
        return LayoutStatus(self.description,
                            pending=tuple(self._steps(self._missing(), self._half_deleted())))

    def validate(self) -> None:
        missing = self._missing()
        if missing:
            raise exc.StorageFailure(
                f"{self.description}: missing the folder(s)"
                f" {', '.join(repr(os.path.join(self.path, m)) for m in missing)};"
                f" {upgrade_hint(f'dir://{self.path}')}"
            )


class DirBackend(base.Backend):
    """Keeps logbooks as JSON files under a directory that several processes may share.

    Configuration keys:

    * ``path`` (required): the directory; a ``file:///path`` or ``dir:///path`` URI gives it too.
    * ``encoding`` (default ``utf-8``): the files' text encoding.
    * ``fsync`` (default ``True``): flush each file to disk before it replaces the old one.
    * ``lock_timeout`` (seconds, default 30): how long an operation waits for the directory's
      lock while another process holds it; then it fails with a
      :class:`~flowengine.exceptions.BackendError` naming the directory and the record.
    * ``max_cache_size``: keep at most this many files' contents in ``file_cache`` (default:
      no bound, as in TaskFlow); a cached file is checked against its modification time and
      size on every read, so a change by another process is always seen.

    Args:
        conf: The configuration.

    Raises:
        ValueError: If no path is given, ``max_cache_size`` is below one or ``lock_timeout`` is
            not a number of seconds >= 0.
    """

    #: The encoding used when the configuration names none.
    DEFAULT_FILE_ENCODING = "utf-8"

    def __init__(self, conf: dict[str, Any] | None) -> None:
        super().__init__(conf)
        path = self._conf.get("path")
        if not path:
            raise ValueError("DirBackend needs a 'path' (or a 'file:///path' URI); none given")
        cache_size = self._conf.get("max_cache_size")
        if cache_size is not None and int(cache_size) < 1:
            raise ValueError(f"Maximum cache size must be greater than or equal to one, not "
                             f"{cache_size!r} (DirBackend option max_cache_size)")
        #: Recently read files (TaskFlow's attribute).
        self.file_cache = FileCache(None if cache_size is None else int(cache_size))
        self._path = os.path.abspath(os.path.expanduser(str(path)))
        self.encoding = str(self._conf.get("encoding", self.DEFAULT_FILE_ENCODING))
        fsync = _truthy(self._conf.get("fsync", True))
        lock_timeout = seconds_option(self._conf, "lock_timeout", _DEFAULT_LOCK_TIMEOUT,
                                      "DirBackend")
        self._store = _DirStore(self._path, self.encoding, fsync, lock_timeout, self.file_cache)

    @property
    def path(self) -> str:
        """The directory records are stored under (absolute)."""
        return self._path

    def get_connection(self) -> base.Connection:
        """Return a connection to the directory (nothing is opened until it is used)."""
        return StoreConnection(self, self._store)

    def close(self) -> None:
        """Nothing to release: files are opened and closed by each operation."""


def reading_session(path: str, description: str,
                    encoding: str = DirBackend.DEFAULT_FILE_ENCODING) -> Session:
    """A session that reads the directory store at ``path`` and never writes in it.

    For a store no flowengine process writes to, TaskFlow's above all (whose layout this is):
    nothing is created in it, not even the lock file, so importing from it leaves it as it was.

    Args:
        path: The directory.
        description: Names the store in messages.
        encoding: The files' text encoding.

    Raises:
        NotADirectoryError: If ``path`` is not a directory.
    """
    path = os.path.abspath(os.path.expanduser(path))
    if not path or not os.path.isdir(path):
        raise NotADirectoryError(f"no such directory '{path}'")
    store = _DirStore(path, encoding, fsync=False, lock_timeout=0.0, file_cache=FileCache(1))
    store.description = description
    return _DirSession(store)
