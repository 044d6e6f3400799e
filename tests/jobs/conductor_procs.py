"""Conductor processes (``flowengine conductor``) and a private Redis, for the fault tests.

A conductor process is handled by flowengine.testing's :class:`~flowengine.testing.processes.
Child`, the handle ``flowengine chaos`` kills, freezes and restarts its processes with. Every
process started here is stopped by pid when the test ends, whatever the test did to it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowengine.testing import processes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Any, timeout: float, what: str) -> None:
    """Call ``check()`` every 20 ms (another process's state: nothing to wait on) until true."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout}s")
        time.sleep(0.02)


class Conductor(processes.Child):
    """One ``flowengine conductor`` process in ``workdir``, logging to ``<workdir>/<name>.log``
    (``freeze``, ``thaw``, ``kill`` and ``signal`` by pid come with the handle)."""

    def __init__(self, name: str, board_uri: str, board_options: dict[str, Any],
                 backend_uri: str, workdir: Path, *extra: str) -> None:
        argv = [sys.executable, "-m", "flowengine.cli.main", "conductor", "--board", board_uri,
                "--backend", backend_uri, "--name", name, "--max-jobs", "1", *extra]
        for key, value in board_options.items():
            argv += ["--board-option", f"{key}={value}"]
        path = os.pathsep.join(filter(None, [str(HERE), str(ROOT),
                                             os.environ.get("PYTHONPATH")]))
        super().__init__(name, argv, workdir, env={"PYTHONPATH": path}, cwd=workdir)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The process (``poll``, ``wait``)."""
        return self.proc

    def output(self) -> str:
        """Everything it wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 0.0) -> int:
        """Killed at once, frozen or not: the test is over."""
        self.kill()
        return self.proc.returncode


@pytest.fixture
def conductors() -> Iterator[list[Conductor]]:
    """Conductors a test starts (append them); all are killed at its end."""
    started: list[Conductor] = []
    yield started
    for conductor in started:
        conductor.stop()


class PrivateRedis:
    """A redis-server of the test's own, with an append-only file, that a test may restart."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which("redis-server") is None:
            from servers import unavailable

            unavailable("redis-server is not installed (`.ci/run` installs it)")
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, 15, f"private redis-server on port {self.port}")

    def _answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # redis-server flushes its append-only file on SIGTERM
            self.process.wait(15)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A started private Redis, killed at the end of the test."""
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
