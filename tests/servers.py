"""The local test servers (RabbitMQ, Redis, PostgreSQL, ZooKeeper, etcd, beanstalkd).

``.ci/services.sh start`` runs them on 127.0.0.1. When one does not answer, that script is run
(once per test process, if the servers are installed) and the check repeated, so tests run by
hand start what they need. A server still missing fails the test when ``CI=true`` and skips it
otherwise. Used by ``tests/conftest.py`` (the ``local_servers`` fixture) and the integration
harness; a plain module so both can import it.
"""

from __future__ import annotations

import glob
import importlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

SERVICES_SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "services.sh"
#: Seconds the script gets (it waits up to a minute for each server's port).
SERVICES_START_TIMEOUT = 240.0
#: The programs the script starts, as `.ci/run` looks for them (shell patterns).
SERVER_PROGRAMS = ("redis-server", "rabbitmq-server", "/usr/lib/postgresql/*/bin/postgres",
                   "/usr/share/java/zookeeper.jar", "etcd", "beanstalkd")
#: Seconds a freshly started server gets to answer its check.
READY_PATIENCE = 15.0


def require_module(name: str) -> Any:
    """Import ``name`` (a test extra), failing under ``CI=true`` and skipping elsewhere if it
    is missing: ``pytest.importorskip`` would let CI pass without running the test."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        unavailable(f"{name} is not installed ({err}); install the 'test' extra")


def unavailable(message: str) -> NoReturn:
    """Fail (under ``CI=true``) or skip the test because a server it needs is missing."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


class LocalServers:
    """Starts the test servers with ``services.sh start``, at most once.

    Args:
        script: The start script.
        programs: What must be installed for the script to work (names on PATH or globs).
        timeout: Seconds the script gets.
        patience: Seconds a server the script started gets to pass its check.
    """

    def __init__(self, script: Path = SERVICES_SCRIPT,
                 programs: Sequence[str] = SERVER_PROGRAMS,
                 timeout: float = SERVICES_START_TIMEOUT,
                 patience: float = READY_PATIENCE) -> None:
        self.script, self.programs, self.timeout = script, tuple(programs), timeout
        self.patience = patience
        self._lock = threading.Lock()
        self._ran = False
        self._outcome: str | None = None

    def missing(self) -> list[str]:
        """The programs that are not installed."""
        return [program for program in self.programs
                if not (glob.glob(program) if "/" in program else shutil.which(program))]

    @property
    def started(self) -> bool:
        """Whether this process ran the script, and it started the servers."""
        return self._ran and self._outcome is None

    def start(self) -> str | None:
        """Run the script the first time only; None if it started the servers, else why not.

        Later calls give the first call's answer: a script that failed once is not run again.
        """
        with self._lock:
            if not self._ran:
                self._ran = True
                self._outcome = self._run()
            return self._outcome

    def _run(self) -> str | None:
        missing = self.missing()
        if missing:
            return f"not installed: {', '.join(missing)} (`.ci/run` installs them)"
        try:
            done = subprocess.run(["bash", str(self.script), "start"], capture_output=True,
                                  text=True, timeout=self.timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"`{self.script} start` did not finish within {self.timeout:.0f}s"
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            return f"`{self.script} start` exited with {done.returncode}: {tail}"
        return None

    def problem(self, check: Callable[[], str | None]) -> str | None:
        """Why a server is not usable, after starting the servers once if needed; None if it is.

        Args:
            check: Returns why the server is not usable (None: it is). Called once when the
                server answers, so a session whose servers are up pays nothing more.
        """
        reason = check()
        if reason is None:
            return None
        not_started = self.start()
        if not_started is not None:
            return f"{reason}; could not start it: {not_started}"
        # The script returns once the ports are open; a server may need a moment more.
        deadline = time.monotonic() + self.patience
        while (reason := check()) is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        return None if reason is None else f"{reason}; still, after `{self.script} start`"

    def require(self, what: str, check: Callable[[], str | None]) -> None:
        """Go on only once ``check`` passes, see :meth:`problem`; else fail or skip the test.

        Args:
            what: The server, for the message ("PostgreSQL test server at ...").
            check: As for :meth:`problem`.
        """
        reason = self.problem(check)
        if reason is not None:
            unavailable(f"{what} unavailable ({reason}); run `.ci/{self.script.name} start`")


#: The one :class:`LocalServers` of this test process.
SERVERS = LocalServers()
