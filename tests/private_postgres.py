"""A PostgreSQL server of one test's own, which the test may stop and start again.

The shared test server (``.ci/services.sh``) is never stopped: other tests use it. This one runs
from Debian's binaries on a free port, with its data in a folder the ``postgres`` user owns (the
server refuses to run as root), and is stopped with ``pg_ctl`` (fast shutdown: every client
connection is cut, as when a database host goes down).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import unavailable

#: Seconds the server gets to start or stop.
PATIENCE = 60.0


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


class PrivatePostgres:
    """A private PostgreSQL server: :meth:`start`, :meth:`stop`, :attr:`url`."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            unavailable("PostgreSQL is not installed (`.ci/run` installs it)")
        assert bin_dir is not None
        self._bin = bin_dir
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        # Not under pytest's tmp_path: that is root's alone, and the server runs as postgres.
        self.folder = Path(tempfile.mkdtemp(prefix="flowengine-pg-"))
        self.data = self.folder / "data"
        shutil.chown(self.folder, "postgres", "postgres")
        self._as_postgres([str(self._bin / "initdb"), "-D", str(self.data), "-A", "trust",
                           "-U", "postgres"])

    @property
    def url(self) -> str:
        """Its URL (database ``postgres``, user ``postgres``)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, argv: list[str]) -> None:
        done = subprocess.run(["su", "postgres", "-c", " ".join(argv)], capture_output=True,
                              text=True, timeout=PATIENCE, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise AssertionError(f"{argv[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start it and return once it accepts connections."""
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder}"
        self._as_postgres([str(self._bin / "pg_ctl"), "-D", str(self.data), "-l",
                           str(self.folder / "server.log"), "-o", f"'{options}'", "-w", "start"])
        deadline = time.monotonic() + PATIENCE
        while not self._answers():
            assert time.monotonic() < deadline, "the private PostgreSQL did not start"
            time.sleep(0.1)  # another process: nothing to wait on

    def stop(self) -> None:
        """Stop it at once (fast shutdown: client connections are cut)."""
        self._as_postgres([str(self._bin / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                           "-w", "stop"])

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port),
                                                                    timeout=0.5):
            return True
        return False

    def remove(self) -> None:
        """Stop it if it runs, and delete its data."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started private PostgreSQL, removed at the end of the test."""
    if os.geteuid() != 0:
        unavailable("a private PostgreSQL needs root (to run it as the postgres user)")
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.remove()
