"""Message files of the flowengine-fs transport: their names, reads and writes, and recycling.

Creating and deleting files are the dearest things a message costs the file system: ext4
without a journal, for one, checks past every inode freed in the last minute before it hands
out a new one, so at a thousand messages a second a create costs about a millisecond of CPU.
So a settled message's file is not deleted but blanked (its body may hold secrets) and kept as
a spare, and a later publish writes into a spare and renames it into its queue: the rename a new
file takes anyway, minus the create and the delete. Spares are first the process's own
(``spare.<n>`` beside its claims: the cheapest rename), then shared (see :class:`Spares`), and
bounded in number and size; recovery of a dead process deletes what it left.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from flowengine.worker_based.broker import transport_fs_order as order

#: Spare files a process keeps in its own claim folders, per data folder (see :class:`Spares`).
OWN_SPARES = 64
#: Spare files offered in the shared folder at most; more settled messages are deleted.
SHARED_SPARES = 1024
SHARED = "spares"
SPARE_PREFIX = "spare."
OFFERED = ".spare"
TAKEN = ".taken"
#: Seconds between listings of the shared folder by a process that found it empty...
RELIST_S = 0.01
#: ... and by one that offers its spares there, to count them.
RECOUNT_S = 1.0
#: Bytes of blanks a message is padded with to fill a larger spare instead of truncating it.
PAD_LIMIT = 4096
#: Larger message files are deleted once settled, not kept (a spare keeps its disk blocks).
SPARE_MAX_BYTES = 16384
#: A message given back to its queue keeps its name (its FIFO place) plus this mark, which
#: deliveries report as ``delivery_info["redelivered"]``, as AMQP brokers do.
REDELIVERED_MARK = ".redelivered"


class Stamper:
    """File names that sort in send order within a process, whatever the clock does."""

    def __init__(self, clock: Any = time.time_ns) -> None:
        self._clock = clock
        self._last = 0
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def next_name(self) -> str:
        """A new message file name, later in order than every earlier one."""
        with self._lock:
            self._last = max(self._clock(), self._last + 1)
            return f"{self._last:020d}.{os.getpid()}.{next(self._seq):010d}.msg"


def expired(name: str, expiration: Any) -> bool:
    """Whether the message in file ``name`` has outlived its ``expiration`` property."""
    # Per-message TTL as AMQP has it: milliseconds from publication, which the name records.
    try:
        published, ttl_ms = int(order.stamp_of(name).split(".", 1)[0]), int(expiration or 0)
    except ValueError:  # a file this transport did not name: no TTL to apply
        return False
    return ttl_ms > 0 and time.time_ns() > published + ttl_ms * 1_000_000


def returned_name(name: str) -> str:
    """The name a message given back to its queue takes (see :data:`REDELIVERED_MARK`)."""
    stem = name[: -len(".msg")]
    return name if stem.endswith(REDELIVERED_MARK) else f"{stem}{REDELIVERED_MARK}.msg"


def write(path: str, data: bytes, fsync: bool, spare_size: int | None = None) -> None:
    """Write ``data`` to a new file, or over a spare of ``spare_size`` bytes."""
    if spare_size is None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    else:
        fd = os.open(path, os.O_WRONLY)
    truncate = spare_size is not None and len(data) < spare_size
    if truncate and spare_size - len(data) <= PAD_LIMIT:  # type: ignore[operator]
        # JSON allows trailing blanks: padding saves a system call (and a GIL hand-off).
        data, truncate = data + b" " * (spare_size - len(data)), False  # type: ignore[operator]
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if truncate:
            os.ftruncate(fd, len(data))
        if fsync:
            os.fsync(fd)
    except BaseException:
        # A half-written file (a full disk) must not stay behind in tmp/ or as a spare that
        # still holds part of a message: the caller writes the message anew, elsewhere.
        os.close(fd)
        with contextlib.suppress(OSError):  # read-only: the start-up sweep of tmp/ removes it
            os.unlink(path)
        raise
    os.close(fd)


def _blank(path: str, size: int) -> bool:
    """Overwrite the ``size`` bytes of ``path`` with blanks; False if it is gone (or deleted
    because a copy-on-write file system had no room to overwrite it).

    Blanks, not a truncation: a truncation frees the file's blocks, which the next message
    allocates again, and costs ext4 a journalled metadata update each way (milliseconds).
    """
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        os.pwrite(fd, b" " * size, 0)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        unlink(path)  # frees space rather than wait for it
        return False
    finally:
        os.close(fd)
    return True


def read(path: str) -> bytes:
    """The whole file: three system calls where ``open().read()`` makes six."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            if len(chunk) < 65536:  # a short read of a regular file is its end
                break
        return b"".join(chunks)
    finally:
        os.close(fd)


def unlink(path: str) -> None:
    """Delete ``path`` if it is still there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Spares:
    """Settled message files kept for reuse under one data folder by this process (thread-safe).

    A process keeps up to ``own_limit`` in its own claim folders and offers the rest in the
    shared ``spares/`` folder, named ``<pid>.<n>.<size>.spare``, where a process that sends
    more than it receives (a worker: one request in, two replies out) takes them by renaming
    one to ``<its pid>.<n>.taken``: exactly one taker wins. Beyond ``shared_limit`` offered
    files, settled ones are deleted.

    Args:
        root: The transport's data folder.
        own_limit: Spares kept in the process's own folders.
        shared_limit: Spares offered in ``spares/``, as this process last counted them.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        root: str,
        own_limit: int = OWN_SPARES,
        shared_limit: int = SHARED_SPARES,
        clock: Any = time.monotonic,
    ) -> None:
        self._root = root
        self._shared = os.path.join(root, SHARED)
        self._own_limit, self._shared_limit, self._clock = own_limit, shared_limit, clock
        self._own: collections.deque[tuple[str, int]] = collections.deque()
        self._offered: collections.deque[str] = collections.deque()  # listed, not yet tried
        self._count = 0  # files in spares/ at the last listing, plus this process's offers since
        self._counted_at = -RECOUNT_S
        self._lock = threading.Lock()

    def keep(self, path: str, size: int) -> None:
        """Recycle the settled message file ``path`` of ``size`` bytes (or delete it).

        Its content is blanked first: a consumed body (arguments, results, perhaps secrets)
        must not stay readable in a spare until a later message overwrites it.

        Raises:
            OSError: The file could not be emptied or moved (a read-only disk); it is as it was.
        """
        if size > SPARE_MAX_BYTES:
            unlink(path)
            return
        if not _blank(path, size):
            return
        with self._lock:
            own = len(self._own) < self._own_limit
        if own:
            spare = f"{os.path.dirname(path)}/{SPARE_PREFIX}{next(_SEQ)}"
            try:
                os.rename(path, spare)  # within its folder: no cross-directory rename lock
            except FileNotFoundError:
                return
            with self._lock:
                self._own.append((spare, size))
            return
        since = self._clock() - self._counted_at
        with self._lock:
            full = self._count >= self._shared_limit
        # Counted long ago, or full by this process's reckoning (takers may have taken since).
        if since >= RECOUNT_S or (full and since >= RELIST_S):
            self._list()
        with self._lock:
            full = self._count >= self._shared_limit
            self._count += not full
        if full:
            unlink(path)
            return
        offered = f"{self._shared}/{os.getpid()}.{next(_SEQ)}.{size}{OFFERED}"
        try:
            os.rename(path, offered)
        except FileNotFoundError:
            pass

    def take(self) -> tuple[str, int] | None:
        """A spare file, now this process's alone, and its size; None if there is none."""
        with self._lock:
            if self._own:
                return self._own.pop()
            # Right away if the last listing found some (more will have come since); after a
            # pause if it found none, so a process sending into an empty pool does not list
            # the folder for every message.
            relist = not self._offered and (
                self._count > 0 or self._clock() - self._counted_at >= RELIST_S
            )
        if relist:
            self._list()
        while True:
            with self._lock:
                if not self._offered:
                    return None
                name = self._offered.popleft()
            mine = f"{self._shared}/{os.getpid()}.{next(_SEQ)}{TAKEN}"
            try:
                os.rename(f"{self._shared}/{name}", mine)
            except FileNotFoundError:
                continue  # another process took it
            return mine, int(name.rsplit(".", 2)[-2])

    def put_back(self, path: str, size: int) -> None:
        """Keep a spare :meth:`take` gave that could not be written (a read-only disk)."""
        with self._lock:
            self._own.append((path, size))

    def discard(self) -> None:
        """Delete this process's own spares and its emptied claim folders (at a clean exit:
        what is left there afterwards is a message it did not settle)."""
        with self._lock:
            own, self._own = list(self._own), collections.deque()
        for path, _size in own:
            unlink(path)
        remove_empty_claims(self._root)

    def _list(self) -> None:
        try:
            names = [name for name in os.listdir(self._shared) if name.endswith(OFFERED)]
        except FileNotFoundError:
            names = []
        with self._lock:
            self._offered = collections.deque(names)
            self._count, self._counted_at = len(names), self._clock()


def remove_empty_claims(root: str) -> None:
    """Remove this process's claim folders under ``root`` that hold nothing (any more)."""
    claims = os.path.join(root, "claimed", str(os.getpid()))
    with contextlib.suppress(OSError):
        for queue_dir in os.listdir(claims):
            with contextlib.suppress(OSError):  # not empty: an unsettled message
                os.rmdir(os.path.join(claims, queue_dir))
        os.rmdir(claims)


def sweep(root: str, alive: Callable[[int], bool]) -> None:
    """Delete the spares that processes now gone had taken but not used."""
    shared = os.path.join(root, SHARED)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(shared):
            pid = name.split(".", 1)[0]
            if name.endswith(TAKEN) and pid.isdigit() and not alive(int(pid)):
                unlink(os.path.join(shared, name))


# One sequence for every pool of the process: spare names must never collide in a folder.
_SEQ = itertools.count()
_SPARES: dict[str, Spares] = {}
#: Data folders this process claimed messages in (their empty claim folders go at exit), once
#: what an earlier process with the same pid left in its claim folder was handed back.
CLAIMED_IN: set[str] = set()
_SPARES_LOCK = threading.Lock()
_ADOPTING = threading.Lock()


def _after_fork() -> None:
    # A forked child must not write over files its parent still counts as its own spares, and
    # has a pid of its own, so a claim folder of its own to adopt. A lock one of the parent's
    # other threads held at the fork would never be released in the child.
    global _SPARES_LOCK, _ADOPTING
    _SPARES.clear()
    CLAIMED_IN.clear()
    _SPARES_LOCK, _ADOPTING = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def adopt_claims(root: str, hand_back: Callable[[], object]) -> None:
    """Make data folder ``root``'s claim folder of this pid this process's, calling
    ``hand_back`` first (once per process and folder, before its first claim there)."""
    with _ADOPTING:
        if root not in CLAIMED_IN:
            hand_back()
            CLAIMED_IN.add(root)


@atexit.register
def _discard_all() -> None:
    # Registered before the broker clients' own exit handler (they import this module), so it
    # runs after they have settled and closed.
    for pool in list(_SPARES.values()):
        with contextlib.suppress(Exception):
            pool.discard()
    for root in list(CLAIMED_IN):
        remove_empty_claims(root)


def spares(root: str) -> Spares:
    """This process's spares under data folder ``root``, an absolute path (look them up each
    time rather than keep them: a forked child gets new ones)."""
    found = _SPARES.get(root)
    if found is None:
        with _SPARES_LOCK:
            found = _SPARES.setdefault(root, Spares(root))
    return found
