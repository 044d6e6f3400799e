"""The cluster suite's harness without its servers: who counts as a user of the cluster and
who stops it (``tests/cluster_servers.py``), and which members ``.ci/cluster.sh start`` adopts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import cluster_servers
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "cluster.sh"


class Processes:
    """Stands in for the process table: pid -> identity, for ClusterUsers."""

    def __init__(self, *pids: int) -> None:
        self.running = {pid: f"born-{pid}" for pid in pids}

    def identity(self, pid: int) -> str | None:
        return self.running.get(pid)


def _user(folder: Path, table: Processes, pid: int) -> cluster_servers.ClusterUsers:
    users = cluster_servers.ClusterUsers(folder, identity=table.identity, pid=pid)
    with users.locked():
        users.join()
    return users


def test_the_last_user_of_a_cluster_tests_started_stops_it(tmp_path: Path) -> None:
    table = Processes(11, 12)
    first, second = _user(tmp_path, table, 11), _user(tmp_path, table, 12)
    with first.locked():
        first.mark_started()
        assert not first.leave(), "worker 12 still uses the cluster"
    with second.locked():
        assert second.leave()
        second.stopped()
        assert not second.marker.exists()


def test_a_cluster_tests_did_not_start_is_never_stopped(tmp_path: Path) -> None:
    only = _user(tmp_path, Processes(11), 11)
    with only.locked():
        assert not only.leave()


def test_a_user_that_died_without_leaving_counts_no_more(tmp_path: Path) -> None:
    table = Processes(11, 12)
    starter, survivor = _user(tmp_path, table, 11), _user(tmp_path, table, 12)
    with starter.locked():
        starter.mark_started()
    del table.running[11]
    with survivor.locked():
        assert survivor.live() == [12]
        assert survivor.leave()
    assert list(survivor.users.iterdir()) == []


def test_a_reused_pid_is_not_the_user_that_had_it(tmp_path: Path) -> None:
    table = Processes(11)
    _user(tmp_path, table, 11)
    table.running[11] = "born-later"
    controller = cluster_servers.ClusterUsers(tmp_path, identity=table.identity, pid=99)
    with controller.locked():
        assert controller.live() == []


def test_process_identity_tells_running_processes() -> None:
    assert cluster_servers.process_identity(os.getpid())
    assert cluster_servers.process_identity(os.getpid()) == \
        cluster_servers.process_identity(os.getpid())
    sleeper = subprocess.Popen(["sleep", "0"])
    sleeper.wait()
    assert cluster_servers.process_identity(sleeper.pid) is None


# ---- .ci/cluster.sh start: which member on an open port it adopts -------------------------------


@pytest.fixture
def open_port() -> Iterator[int]:
    """A port something listens on (as a member or a stranger would)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def _member_running(port: int, pidfile: Path) -> subprocess.CompletedProcess[str]:
    """cluster.sh's check of one member, sourced (prints what start would do)."""
    line = (f'source "{SCRIPT}"; if member_running {port} "{pidfile}" "test member"; '
            "then echo adopt; else echo start; fi")
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


def test_a_free_port_is_started(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    done = _member_running(free, tmp_path / "member.pid")
    assert (done.returncode, done.stdout.strip()) == (0, "start")


def test_a_member_the_script_started_is_adopted(tmp_path: Path, open_port: int) -> None:
    pidfile = tmp_path / "member.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    done = _member_running(open_port, pidfile)
    assert (done.returncode, done.stdout.strip()) == (0, "adopt"), done.stderr


def test_a_port_without_a_pid_file_is_refused(tmp_path: Path, open_port: int) -> None:
    done = _member_running(open_port, tmp_path / "member.pid")
    assert done.returncode != 0 and done.stdout == ""
    assert f"port {open_port} (test member) answers" in done.stderr
    assert "is missing" in done.stderr
    if shutil.which("ss"):  # iproute2's, which names the holder (a machine may lack it)
        assert f"pid={os.getpid()}" in done.stderr


def test_a_pid_file_of_a_dead_process_is_refused(tmp_path: Path, open_port: int) -> None:
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    pidfile = tmp_path / "member.pid"
    pidfile.write_text(f"{gone.pid}\n")
    done = _member_running(open_port, pidfile)
    assert done.returncode != 0 and done.stdout == ""
    assert f"names process {gone.pid}, which is not running" in done.stderr
