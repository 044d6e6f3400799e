"""Disk pressure on the flowengine-fs transport: a full or read-only data folder as an outage.

A write into the data folder that fails because the file system is full (``ENOSPC``, or a quota:
``EDQUOT``) or read-only (``EROFS``) is not a broken message: it is the "broker" being away, and
is treated as a broker outage is. The write raises :class:`DiskUnwritable` (an ``OSError``, so
kombu and the proxy count it among the transport's channel errors and retry the publish with
capped backoff until the message's deadline), which names the condition and the folder; the
process logs the condition once when the episode starts and once when it ends, never per
message; consumers take nothing new meanwhile (what they took could not be answered); and an
engine does not count the episode against its workers' leases, as it does not count its own
broker outages (see :class:`Watch`).

An episode starts at the first failed write, or when a probe finds the folder read-only or
(``statvfs``) without a free block and a small write fails too; it ends when a probe can write
:data:`FREE_MIN` bytes.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

LOG = logging.getLogger(__name__)

#: The errors that mean "the disk", not "the message": no space, no quota, read-only.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
#: Seconds between probes of the folder (one ``statvfs``; a write while an episode lasts).
PROBE_INTERVAL = 0.25
#: Bytes a probe writes before it calls an episode over, so one message does not end it.
FREE_MIN = 64 * 1024
#: Seconds after an episode during which a new one is logged at debug level only (a large
#: message may fail again where a probe found room): a flapping disk logs once, not per message.
QUIET_RESTART = 10.0
#: Longest wait between retries of a write that failed for the disk: a local disk is cheap to
#: look at, and an outcome should go out within a second of space coming back.
RETRY_INTERVAL_MAX = 1.0

_CONDITIONS = {errno.ENOSPC: "full", errno.EDQUOT: "over its quota", errno.EROFS: "read-only"}


def is_disk_error(err: BaseException) -> bool:
    """Whether ``err`` says the file system cannot take writes (see :data:`DISK_ERRNOS`)."""
    return isinstance(err, OSError) and err.errno in DISK_ERRNOS


class DiskUnwritable(OSError):
    """The flowengine-fs data folder cannot take writes (full, over quota or read-only).

    Its message names the condition and the folder. The transport has logged the episode
    already, so retry loops log it at debug level only (``reported``), and retry it at least
    every :data:`RETRY_INTERVAL_MAX` seconds (``retry_interval_max``).
    """

    reported = True
    retry_interval_max = RETRY_INTERVAL_MAX
    #: What a retry sequence that gives up says happened (instead of "the broker is away").
    outage = "the flowengine-fs data folder is unwritable"


def describe(folder: str, err: OSError) -> str:
    """``flowengine-fs data folder /x is full (ENOSPC: No space left on device)``."""
    code = err.errno or 0
    name = errno.errorcode.get(code, str(code))
    condition = _CONDITIONS.get(code, "unwritable")
    return (f"flowengine-fs data folder {folder} is {condition} "
            f"({name}: {os.strerror(code)})")


class Disk:
    """One data folder's write health as this process sees it (thread-safe).

    Args:
        folder: The data folder (absolute).
        clock: Monotonic seconds.
        probe: Writes a probe file of so many bytes in the folder, raising ``OSError`` if it
            cannot, and removes it (injectable for tests).
        stat: ``os.statvfs`` (injectable for tests).
    """

    def __init__(self, folder: str, clock: Callable[[], float] = time.monotonic,
                 probe: Callable[[str, int], None] | None = None,
                 stat: Callable[[str], os.statvfs_result] = os.statvfs) -> None:
        self.folder = folder
        self._clock, self._stat = clock, stat
        self._probe = probe or _write_probe
        self._lock = threading.Lock()
        self._since: float | None = None  # when the current episode began
        self._error: OSError | None = None
        self._failures = 0
        self._quiet = False  # the episode began soon after the last: its end is not logged
        self._next_probe = 0.0
        self._ended_at = -QUIET_RESTART
        #: Episodes ended so far, and the length of the last one (see :class:`Watch`).
        self.ended = 0
        self.last_outage = 0.0

    @property
    def unwritable(self) -> bool:
        """Whether an episode is going on."""
        return self._since is not None

    @property
    def problem(self) -> str | None:
        """The current episode's description (None when writable)."""
        error = self._error
        return None if self._since is None or error is None else describe(self.folder, error)

    def failed(self, err: OSError, probe: bool = False) -> DiskUnwritable:
        """Record a write that failed for the disk (or a probe); the error to raise instead."""
        with self._lock:
            self._failures += not probe
            started = self._since is None
            if started:
                self._since, self._error = self._clock(), err
                self._next_probe = self._since + PROBE_INTERVAL
        text = describe(self.folder, err)
        if started:
            self._quiet = self._clock() - self._ended_at < QUIET_RESTART
            LOG.log(logging.DEBUG if self._quiet else logging.WARNING,
                    "%s: writes wait and are retried until it takes them again; consumers "
                        "take no new message meanwhile", text)
        return DiskUnwritable(err.errno, text)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Raise a disk error of the block as :class:`DiskUnwritable` (recording it)."""
        try:
            yield
        except OSError as err:
            if not is_disk_error(err):
                raise
            raise self.failed(err) from err

    def refused(self, err: BaseException) -> bool:
        """Whether ``err`` is a disk error (then recorded, not to be raised)."""
        if not is_disk_error(err):
            return False
        self.failed(err)  # type: ignore[arg-type]
        return True

    def succeeded(self) -> None:
        """Record a write that went through (ends an episode)."""
        if self._since is not None:
            self._end()

    def check(self) -> bool:
        """Probe the folder (at most every :data:`PROBE_INTERVAL`); whether it is writable."""
        now = self._clock()
        if now < self._next_probe:
            return self._since is None
        self._next_probe = now + PROBE_INTERVAL
        try:
            if self._since is None:
                self._cheap_check()
            else:
                self._full_check()
        except OSError as err:
            if not is_disk_error(err):
                return self._since is None  # a vanished folder is the channel's business
            self.failed(err, probe=True)
            return False
        if self._since is not None:
            self._end()
        return True

    def _cheap_check(self) -> None:
        found = self._stat(self.folder)
        if found.f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        # What this process may use (root may use the blocks reserved for it). A file system
        # that says "none" is taken at its word only once a write fails too: some report 0.
        free = found.f_bfree if os.geteuid() == 0 else found.f_bavail
        if free == 0:
            self._probe(self.folder, 1)

    def _full_check(self) -> None:
        self._cheap_check()
        self._probe(self.folder, FREE_MIN)

    def _end(self) -> None:
        with self._lock:
            if self._since is None:
                return
            lasted, failures = self._clock() - self._since, self._failures
            self._since, self._error, self._failures = None, None, 0
            self._ended_at = self._clock()
            self.ended, self.last_outage = self.ended + 1, lasted
        LOG.log(logging.DEBUG if self._quiet else logging.WARNING,
                "flowengine-fs data folder %s takes writes again after %.1fs "
                "(%d write(s) of this process failed meanwhile)", self.folder, lasted, failures)


def _write_probe(folder: str, size: int) -> None:
    path = os.path.join(folder, "tmp", f"probe.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(b"\n" * size)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


class Later:
    """Operations a read-only disk refused, retried in order by :meth:`retry` (thread-safe).

    A consumer's settlements (acknowledging a message, giving one back) cannot wait: they are
    made from task threads. One the disk refuses is kept here and retried before the consumer
    takes its next message; the message stays claimed by the process meanwhile (and is
    requeued from there should the process die).
    """

    def __init__(self, disk: Disk) -> None:
        self._disk = disk
        self._waiting: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = (
            collections.deque())

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def attempt(self, operation: Callable[..., None], *args: Any) -> bool:
        """Run ``operation(*args)``, or keep it for later if the disk refuses (False)."""
        try:
            operation(*args)
        except OSError as err:
            if not self._disk.refused(err):
                raise
            self._waiting.append((operation, args))
            return False
        return True

    def retry(self) -> None:
        """Run what waits, in order, until the disk refuses again (from one thread only)."""
        while self._waiting:
            operation, args = self._waiting[0]  # only this thread takes from the left
            try:
                operation(*args)
            except OSError as err:
                if self._disk.refused(err):
                    return  # refused again (and kept, first): the rest wait too
                self._waiting.popleft()
                raise
            self._waiting.popleft()


def open_lock(path: str) -> Any:
    """``path`` opened for ``flock`` (created if need be); read-only on a read-only disk, where
    the lock still serialises readers of what it guards."""
    try:
        try:
            return open(path, "a")  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:  # its folder refused by a full disk, or removed
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return open(path, "a")  # noqa: SIM115
    except OSError as err:
        if err.errno != errno.EROFS:
            raise
        return open(path)  # noqa: SIM115


class Watch:
    """What an engine's broker client needs of a data folder's episodes.

    While the folder is unwritable, nothing is judged (no lease lapses: the workers could not
    send their heartbeats); once it takes writes again, :meth:`take` gives the episode's length
    once, which the client hands its engines as the length of a broker outage.
    """

    def __init__(self, disk: Disk) -> None:
        self._disk = disk
        self._seen = disk.ended

    @property
    def unwritable(self) -> bool:
        """Whether the folder is unwritable (probes it, at most every PROBE_INTERVAL)."""
        return not self._disk.check()

    @property
    def problem(self) -> str | None:
        """The current episode's description (None when writable)."""
        return self._disk.problem

    def take(self) -> float:
        """Seconds of the episodes that ended since the last call (0.0: none)."""
        ended = self._disk.ended
        if ended == self._seen:
            return 0.0
        self._seen = ended
        return self._disk.last_outage


def watch(transport: str, transport_options: Mapping[str, Any]) -> Watch | None:
    """A new :class:`Watch` on the data folder ``transport_options`` name (or the default);
    None unless ``transport`` (a connection's driver type) is flowengine-fs."""
    from flowengine.worker_based.broker import transport_fs  # the transport imports this module

    if transport != transport_fs.TRANSPORT_NAME:
        return None
    folder = transport_options.get("data_folder") or transport_fs.default_data_folder()
    return Watch(disk(os.path.abspath(folder)))


_DISKS: dict[str, Disk] = {}
_DISKS_LOCK = threading.Lock()


def disk(folder: str) -> Disk:
    """This process's :class:`Disk` for data folder ``folder`` (an absolute path)."""
    found = _DISKS.get(folder)
    if found is None:
        with _DISKS_LOCK:
            found = _DISKS.setdefault(folder, Disk(folder))
    return found


def sweep_tmp(folder: str, alive: Callable[[int], bool]) -> int:
    """Delete what processes now gone left half-written in ``tmp/``; how many files."""
    tmp = os.path.join(folder, "tmp")
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            pid = _writer(name)
            if pid is not None and not alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(tmp, name))
                    removed += 1
    if removed:
        LOG.info("flowengine-fs: removed %d half-written file(s) of processes now gone from %s",
                 removed, tmp)
    return removed


def _writer(name: str) -> int | None:
    """The pid that wrote ``tmp/<name>``: ``<stamp>.<pid>.<seq>.msg`` (messages),
    ``<table>.json.<pid>.<thread>`` (binding tables), ``probe.<pid>.<thread>`` (probes)."""
    parts = name.split(".")
    if name.endswith(".msg") and len(parts) >= 4:
        candidate = parts[1]
    elif len(parts) >= 3:
        candidate = parts[-2]
    else:
        return None
    return int(candidate) if candidate.isdigit() else None


# A forked child sees its own writes fail or succeed.
os.register_at_fork(after_in_child=_DISKS.clear)
