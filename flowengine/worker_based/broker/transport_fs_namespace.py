"""The PID namespace a flowengine-fs data folder's processes share.

flowengine-fs tells processes apart, and finds them dead, by their process id: a process's
claims are ``claimed/<pid>``, and message, temporary and doorbell names carry the pid. Processes
in different PID namespaces (containers sharing the folder as a volume, each with its own
process ids) may have the same id, and cannot see whether each other's is alive: one would hand
back the messages another still holds, or take its claims for its own. So a folder serves one
namespace at a time.

Each connection holds a shared lock on ``pidns/<namespace>.lock`` for as long as it is open
(``<namespace>`` is the inode of ``/proc/self/ns/pid``, which tells namespaces apart on one
machine). A connection from another namespace tries to lock each other namespace's file
exclusively, without waiting: a file nobody holds was left by processes that are gone (the
kernel drops a lock with its holder) and is removed; a file held means live processes of
another namespace use the folder, and the connection is refused with :class:`ForeignNamespace`.
Where ``/proc/self/ns/pid`` does not exist (not Linux), nothing is checked.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os

LOG = logging.getLogger(__name__)

#: The folder (under the data folder) of the namespaces' lock files.
FOLDER = "pidns"
_SUFFIX = ".lock"


class ForeignNamespace(RuntimeError):
    """Live processes of another PID namespace use this flowengine-fs data folder."""


def current() -> str | None:
    """This process's PID namespace (None where the system does not say)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


class Membership:
    """This connection's hold on its namespace's lock file in ``folder`` (see the module).

    Raises:
        ForeignNamespace: naming the folder, when processes of another namespace use it.
    """

    def __init__(self, folder: str, namespace: str | None = None) -> None:
        self._fd: int | None = None
        namespace = namespace if namespace is not None else current()
        if namespace is None:
            return
        locks = os.path.join(folder, FOLDER)
        try:
            os.makedirs(locks, exist_ok=True)
            fd = _hold(os.path.join(locks, namespace + _SUFFIX))
        except OSError as err:
            # A full or read-only folder is the disk watch's business (an outage, reported
            # as such), not a reason to refuse the connection: checked on the next one.
            LOG.debug("flowengine-fs data folder %s: PID namespace not checked (%s)", folder, err)
            return
        try:
            for name in os.listdir(locks):
                if name.endswith(_SUFFIX) and name != namespace + _SUFFIX:
                    _claim_if_abandoned(folder, os.path.join(locks, name))
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def close(self) -> None:
        """Let go of the namespace (the last connection of a namespace frees its file)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _hold(path: str) -> int:
    """A descriptor holding a shared lock on the file at ``path`` (created if need be)."""
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            # A newcomer of another namespace may have found the file abandoned and removed
            # it while this waited for the lock: a lock on a removed file protects nothing.
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _claim_if_abandoned(folder: str, path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # removed by another newcomer meanwhile
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ForeignNamespace(
                f"flowengine-fs data folder {folder} is in use by processes of another PID "
                f"namespace (another container?). flowengine-fs tells processes apart by their "
                f"process id, so every process of one folder must share a PID namespace: run "
                f"them in one container or with the host's (docker run --pid=host), give each "
                f"namespace its own data_folder, or use Redis or RabbitMQ") from None
        with contextlib.suppress(OSError):
            os.unlink(path)  # abandoned: its processes are gone
    finally:
        os.close(fd)
