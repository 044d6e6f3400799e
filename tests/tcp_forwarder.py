"""A TCP forwarder a test puts between one process and a server, to cut that process off.

The server keeps running for everyone else; only the connections through the forwarder are
affected, so a test can partition one conductor from a shared board server. Two ways to cut:

* :meth:`Forwarder.blackhole`: connections stay open but nothing passes either way, and new ones
  are accepted and never answered (a network partition: calls hang until the client times out);
* :meth:`Forwarder.refuse`: every connection is closed and new ones are refused (the server
  looks down).

:meth:`Forwarder.restore` lets traffic through again (new connections only after a refusal).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import urllib.parse
from collections.abc import Iterator

#: Bytes moved per read.
CHUNK = 65536


class Forwarder:
    """Forwards ``127.0.0.1:<port>`` to ``host:port`` until :meth:`close`.

    Args:
        host: The server's host.
        port: The server's port.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._lock = threading.Lock()
        self._mode = "open"  # open, blackhole or refuse
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = threading.Event()
        self._listener = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, daemon=True,
                                           name=f"forwarder-{self.port}")
        self._accepting.start()

    @staticmethod
    def _listen(port: int) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        return listener

    def via(self, uri: str) -> str:
        """``uri`` with its host and port replaced by this forwarder's."""
        parts = urllib.parse.urlsplit(uri)
        netloc = f"127.0.0.1:{self.port}"
        if parts.username is not None:
            auth = parts.username + (f":{parts.password}" if parts.password else "")
            netloc = f"{auth}@{netloc}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def _accept(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                listener = self._listener
            try:
                readable, _, _ = select.select([listener], [], [], 0.1)
            except (OSError, ValueError):  # closed by refuse(): wait for restore()
                self._closed.wait(0.05)
                continue
            if not readable:
                continue
            try:
                client, _ = listener.accept()
            except OSError:
                continue
            with self._lock:
                mode = self._mode
            if mode == "refuse":
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while not self._closed.is_set():
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for source in readable:
                    data = source.recv(CHUNK)
                    if not data:
                        return
                    with self._lock:
                        passing = self._mode == "open"
                    if passing:  # in a blackhole what was sent is lost, as on a cut link
                        peers[source].sendall(data)
        except OSError:
            return
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock, contextlib.suppress(ValueError):
                self._pairs.remove((client, server))

    def blackhole(self) -> None:
        """Let nothing through, and close nothing (a partition)."""
        with self._lock:
            self._mode = "blackhole"

    def refuse(self) -> None:
        """Close every connection and refuse new ones (the server looks down)."""
        with self._lock:
            self._mode = "refuse"
            pairs, self._pairs = self._pairs, []
            self._listener.close()
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()

    def restore(self) -> None:
        """Let traffic through again."""
        with self._lock:
            if self._mode == "refuse":
                self._listener = self._listen(self.port)
            self._mode = "open"

    def close(self) -> None:
        """Stop forwarding and close everything."""
        self.refuse()
        self._closed.set()
        self._accepting.join(5)


@contextlib.contextmanager
def forwarding(host: str, port: int) -> Iterator[Forwarder]:
    """A :class:`Forwarder` to ``host:port``, closed at the end of the block."""
    forwarder = Forwarder(host, port)
    try:
        yield forwarder
    finally:
        forwarder.close()
