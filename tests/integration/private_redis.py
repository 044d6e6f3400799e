"""A Redis server of the test's own, on a free port: stopped and restarted at will.

The shared test servers are never stopped; a test that takes Redis away starts this one. A stop
either keeps the data (a snapshot is saved and loaded again, as a production Redis with
persistence would) or loses it (no snapshot: a restart empty, a flush, a failover that lost it).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from pathlib import Path

from fault_support import wait_until

#: Seconds the server gets to start or stop.
TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateRedis:
    """``redis-server`` on 127.0.0.1 and a free port, its data in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "redis.log", "ab")  # noqa: SIM115 - the server's for its life
        self._proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.folder), "--dbfilename", "dump.rdb"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        proc = self._proc
        wait_until(lambda: self._answer("PING") == "+PONG" or proc.poll() is not None,
                   TIMEOUT, f"private redis on {self.port} starting")
        if proc.poll() is not None:
            raise AssertionError(f"private redis on {self.port} did not start: "
                                 f"{(self.folder / 'redis.log').read_text()[-500:]}")

    def stop(self, keep_data: bool) -> None:
        """Shut down, saving a snapshot only if ``keep_data``."""
        if not keep_data:
            with contextlib.suppress(FileNotFoundError):
                (self.folder / "dump.rdb").unlink()
        self._answer("SHUTDOWN SAVE" if keep_data else "SHUTDOWN NOSAVE")
        if self._proc is not None:
            try:
                self._proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def _answer(self, command: str) -> str | None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
                conn.sendall(command.encode() + b"\r\n")
                return conn.recv(64).decode(errors="replace").strip() or None
        except OSError:
            return None
