"""etcd jobboard: claims are etcd leases that etcd itself ends; the watch survives a restart.

A private etcd (own ports, own data folder) is restarted in one test; the others use the shared
server under a path of their own. Also: TaskFlow's etcd board and flowengine's read each
other's jobs (same keys).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from boards import make_etcd_board, wipe_etcd
from conductor_procs import free_port, wait_for
from servers import require_module, unavailable
from taskflow_interop import check_boards_share_jobs

from flowengine import states
from flowengine.jobs import base
from flowengine.jobs.base import JobBoard

require_module("etcd3gw")


@pytest.fixture
def namespace(etcd_endpoint: tuple[str, int]) -> Iterator[str]:
    """A board path of this test's own on the shared etcd, wiped afterwards."""
    name = f"fe-test-{uuid.uuid4().hex[:12]}"
    yield name
    wipe_etcd(etcd_endpoint, name)


def _board(server: tuple[str, int], namespace: str, **options: object) -> JobBoard:
    board = make_etcd_board(server, namespace, **options)
    board.connect()
    return board


def test_an_unrenewed_claim_is_ended_by_etcd_and_wakes_waiters(
        etcd_endpoint: tuple[str, int], namespace: str) -> None:
    holder = _board(etcd_endpoint, namespace, ttl=2)  # TaskFlow's conf key for the lease
    waiter = _board(etcd_endpoint, namespace)
    try:
        job = holder.post("j")
        holder.claim(job, "frozen")
        assert 0 < job.expires_in() <= 2  # type: ignore[attr-defined]
        holder.close()  # a holder gone without a word: only the lease can end its claim
        started = time.monotonic()
        [freed] = list(waiter.wait(timeout=15))  # woken by etcd's delete of the lock key
        assert freed.uuid == job.uuid and freed.state == states.UNCLAIMED
        assert time.monotonic() - started > 0.5, "ended at once: not by the lease"
        holder.connect()
        with pytest.raises(base.ClaimLost, match="frozen"):
            holder.keep_alive(job, "frozen")
    finally:
        holder.close()
        waiter.close()


class PrivateEtcd:
    """An etcd of the test's own on free ports, that the test may stop and start again."""

    def __init__(self, workdir: Path) -> None:
        self.port, self.peer = free_port(), free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer}"
        client = f"http://127.0.0.1:{self.port}"
        try:
            self.process = subprocess.Popen(
                ["etcd", "--name", "private", "--data-dir", str(self.workdir / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"private={peer}"],
                stdout=subprocess.DEVNULL, stderr=open(self.workdir / "etcd.log", "ab"))  # noqa: SIM115
        except FileNotFoundError:
            unavailable("etcd is not installed (`.ci/run` installs etcd-server)")
        wait_for(self._answers, 30, f"private etcd on port {self.port}")

    def _answers(self) -> bool:
        import requests

        try:
            return requests.get(f"http://127.0.0.1:{self.port}/version", timeout=1).ok
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
            self.process = None


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[PrivateEtcd]:
    """A private etcd, stopped (by pid) at teardown."""
    server = PrivateEtcd(tmp_path)
    server.start()
    yield server
    server.stop()


def test_the_watch_comes_back_after_an_etcd_restart(private_etcd: PrivateEtcd) -> None:
    server = ("127.0.0.1", private_etcd.port)
    waiter = _board(server, "restart")
    poster = _board(server, "restart")
    try:
        private_etcd.stop()
        private_etcd.start()
        # The waiter's cache follows the board only through its watch (and the re-read after
        # the watch comes back): both jobs posted after the restart must reach it.
        first = poster.post("after-restart")
        wait_for(lambda: waiter.job_count == 1, 20, "the first job reaching the waiter's cache")
        second = poster.post("after-the-watch-is-back")
        wait_for(lambda: waiter.job_count == 2, 10, "the second job reaching the waiter's cache")
        assert [j.uuid for j in waiter.iterjobs()] == [first.uuid, second.uuid]
        waiter.claim(first, "w")
        assert poster.find_owner(first) == "w"
    finally:
        waiter.close()
        poster.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_taskflow_and_flowengine_boards_share_jobs(etcd_endpoint: tuple[str, int],
                                                    namespace: str) -> None:
    impl_etcd = require_module("taskflow.jobs.backends.impl_etcd")
    host, port = etcd_endpoint
    theirs = impl_etcd.EtcdJobBoard("taskflow", {"host": host, "port": port,
                                                 "path": namespace})
    theirs.connect()
    ours = _board(etcd_endpoint, namespace)
    try:
        check_boards_share_jobs(theirs, ours)
    finally:
        theirs.close()
        ours.close()


def test_an_unreachable_etcd_is_named() -> None:
    from flowengine import exceptions as exc
    from flowengine.jobs import backends

    board = backends.fetch("b", {"board": "etcd", "host": "127.0.0.1", "port": free_port(),
                                 "timeout": 1})
    with pytest.raises(exc.JobFailure, match="etcd at 127.0.0.1"):
        board.connect()
    assert not board.connected
