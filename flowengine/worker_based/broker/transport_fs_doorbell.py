"""Doorbells for the flowengine-fs transport: wake a waiting consumer when a message lands.

Polling a queue folder every few milliseconds still delivers a message half a period late on
average, on every hop. A doorbell lets the publisher say "look now" instead: a consuming
connection binds one datagram socket (Linux abstract namespace: no file to leave behind, no
path length limit) and registers it for each queue it consumes as an empty file
``bells/<queue>/<pid>.<token>``; after renaming a message into a queue, a publisher sends one
byte to every bell registered there.

Nothing depends on a ring arriving. A consumer still scans its queues every polling interval,
so a lost, late or refused ring (another platform, a full socket buffer, a bell a publisher
has not seen yet) costs latency, never a message. A waiter empties its socket before it scans,
so a ring that comes while it scans wakes its next wait at once. A consumer whose prefetch
slots are all taken ignores rings and waits for its own process to settle a message, which
wakes it through a socket pair (on every platform).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from queue import Empty

LOG = logging.getLogger(__name__)

#: Folder under the data folder holding one sub-folder of registrations per queue.
BELLS = "bells"
#: Abstract socket names are Linux's; elsewhere consumers poll alone.
SUPPORTED = sys.platform.startswith("linux")
#: Nanoseconds a publisher trusts its list of a queue's bells before it looks at the folder
#: again: a consumer that registers meanwhile is found by its own polling until then.
RECHECK_NS = 50_000_000
#: A bells folder changed this recently may change again within the same timestamp tick
#: (file systems stamp with a coarse clock), so its listing is re-read until it is older.
SETTLE_NS = 1_000_000_000
#: Queues whose bells a publisher remembers (a worker replies to ever new engines).
CACHED_QUEUES = 256
_RING = b"\x01"


def _address(token: str) -> bytes:
    return b"\0flowengine-fs/" + token.encode()


class Doorbell:
    """The waiting end: one socket per consuming connection, registered for each queue.

    The socket is made when the first queue is registered, so a connection that only
    publishes has none. A socket pair carries wake-ups from this process's other threads.

    Args:
        root: The transport's data folder.
    """

    def __init__(self, root: str) -> None:
        self._bells = os.path.join(root, BELLS)
        self._token = f"{os.getpid()}.{secrets.token_hex(8)}"
        self._registered: set[str] = set()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._local: tuple[socket.socket, socket.socket] | None = None  # (waiter's, wakers')
        # What a wait watches: both sockets, or (no room for a message) the local pair alone.
        self._pollers: dict[bool, select.poll] = {True: select.poll(), False: select.poll()}

    def register(self, queue_dir: str) -> None:
        """Ask publishers to ring for ``queue_dir`` (a queue's folder name)."""
        with self._lock:
            if queue_dir in self._registered or not self._open():
                return
            folder = os.path.join(self._bells, queue_dir)
            for _ in range(2):  # a consumer leaving may remove the folder meanwhile: once more
                os.makedirs(folder, exist_ok=True)
                try:
                    # Only once the socket is bound: a refused ring means a dead registration.
                    os.close(os.open(os.path.join(folder, self._token),
                                     os.O_CREAT | os.O_WRONLY, 0o600))  # fmt: skip
                except FileNotFoundError:
                    continue
                self._registered.add(queue_dir)
                return

    def _open(self) -> bool:
        if self._local is None:
            local = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            for end in local:
                end.setblocking(False)
            for poller in self._pollers.values():
                poller.register(local[0], select.POLLIN)
            self._local = local
        if self._sock is None and SUPPORTED:
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
                sock.bind(_address(self._token))
            except OSError as err:  # e.g. sockets forbidden by a sandbox: poll alone
                LOG.debug("flowengine-fs: no doorbell, polling only: %s", err)
                return False
            self._pollers[True].register(sock, select.POLLIN)
            self._sock = sock
        return self._sock is not None

    def unregister(self, queue_dir: str) -> None:
        """Stop being rung for ``queue_dir``."""
        with self._lock:
            if queue_dir in self._registered:
                self._registered.discard(queue_dir)
                _remove(os.path.join(self._bells, queue_dir, self._token))

    def drain(self, get: Callable[[], None], ready: Callable[[], bool],
              polling_interval: float | None, timeout: float | None) -> None:  # fmt: skip
        """Call ``get`` until it delivers instead of raising :class:`queue.Empty`; between
        tries wait for a ring, or ``polling_interval`` seconds at most.

        ``ready`` says whether the consumer has room for a message: while it has none, only a
        wake-up from this process (a settlement freeing room) ends a wait, not a publisher.

        Raises:
            TimeoutError: Nothing was delivered within ``timeout`` seconds.
        """
        started = time.monotonic()
        while True:
            try:
                return get()
            except Empty:
                pass
            wait = polling_interval or 0.0
            if timeout is not None:
                remaining = timeout - (time.monotonic() - started)
                if remaining <= 0:
                    raise TimeoutError()
                wait = min(wait, remaining)
            self.wait(wait, rung=ready())

    def wait(self, timeout: float, rung: bool = True) -> bool:
        """Block until woken or ``timeout`` seconds have passed; True if woken.

        Args:
            timeout: Seconds to wait at most.
            rung: Whether a publisher's ring wakes it too, or only :meth:`wake`.
        """
        sock, local = self._sock, self._local
        if local is None:
            time.sleep(max(timeout, 0.0))
            return False
        events = self._pollers[rung].poll(max(timeout, 0.0) * 1000)
        for fd, _ in events:
            ready = sock if sock is not None and fd == sock.fileno() else local[0]
            with contextlib.suppress(OSError):  # BlockingIOError once empty; closed meanwhile
                while True:
                    ready.recv(16)
        return bool(events)

    def wake(self) -> None:
        """End :meth:`wait` from another thread of this process (say, room freed up)."""
        local = self._local
        if local is not None:
            with contextlib.suppress(OSError):  # full: it is awake already; closed: nobody waits
                local[1].send(_RING)

    def close(self) -> None:
        """Unregister everywhere, then close the socket (so a refused ring means stale)."""
        with self._lock:
            for queue_dir in self._registered:
                _remove(os.path.join(self._bells, queue_dir, self._token))
            self._registered.clear()
            sock, self._sock = self._sock, None
            local, self._local = self._local, None
            self._pollers = {True: select.poll(), False: select.poll()}
        for end in (sock, *(local or ())):
            if end is not None:
                end.close()


class Ringer:
    """The publishing end: rings every bell registered for a queue.

    A queue's registrations are listed once and trusted for :data:`RECHECK_NS`, then again
    for as long as the folder's modification time stays the same, so a ring usually costs one
    ``sendto`` per consumer.

    Args:
        root: The transport's data folder.
        clock: Wall clock in nanoseconds (file modification times are wall clock).
    """

    def __init__(self, root: str, clock: Callable[[], int] = time.time_ns) -> None:
        self._bells = os.path.join(root, BELLS)
        self._clock = clock
        # queue folder -> (when checked, folder mtime, tokens), least recently rung first
        self._known: collections.OrderedDict[str, tuple[int, int, list[str]]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def ring(self, queue_dir: str) -> None:
        """Tell the consumers of ``queue_dir`` (a queue's folder name) to look now."""
        if not SUPPORTED:
            return
        tokens = self._tokens(queue_dir)
        if not tokens:
            return
        with self._lock:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            sock = self._sock
        for token in tokens:
            try:
                sock.sendto(_RING, _address(token))
            except ConnectionRefusedError:
                # Nobody has that socket: its owner died without unregistering.
                _remove(os.path.join(self._bells, queue_dir, token))
                with self._lock:
                    self._known.pop(queue_dir, None)
            except OSError:  # full (it is awake already), or gone: the owner polls anyway
                pass

    def _tokens(self, queue_dir: str) -> list[str]:
        now = self._clock()
        with self._lock:
            known = self._known.get(queue_dir)
            if known is not None:
                self._known.move_to_end(queue_dir)
                if now - known[0] < RECHECK_NS:
                    return known[2]
        folder = os.path.join(self._bells, queue_dir)
        try:
            mtime = os.stat(folder).st_mtime_ns
            if known is None or known[1] != mtime or now - mtime < SETTLE_NS:
                tokens = os.listdir(folder)
            else:
                tokens = known[2]
        except OSError:  # no consumer has registered (yet)
            mtime, tokens = 0, []
        with self._lock:
            self._known[queue_dir] = (now, mtime, tokens)
            if len(self._known) > CACHED_QUEUES:
                self._known.popitem(last=False)
        return tokens

    def close(self) -> None:
        """Close the sending socket."""
        with self._lock:
            sock, self._sock = self._sock, None
            self._known.clear()
        if sock is not None:
            sock.close()


def sweep(root: str, alive: Callable[[int], bool]) -> None:
    """Remove the registrations of processes that are gone (killed before they could)."""
    bells = os.path.join(root, BELLS)
    with contextlib.suppress(OSError):
        for queue_dir in os.listdir(bells):
            folder = os.path.join(bells, queue_dir)
            with contextlib.suppress(OSError):
                for token in os.listdir(folder):
                    pid = token.split(".", 1)[0]
                    if pid.isdigit() and not alive(int(pid)):
                        _remove(os.path.join(folder, token))


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):  # only when it was the last one
        os.rmdir(os.path.dirname(path))
