"""flowengine-fs disk pressure: episodes, their log lines, the tmp/ sweep, emptied spares.

The real full and read-only file systems are in tests/integration/test_faults_disk.py; here
the episode bookkeeping runs on an injected clock, probe and ``statvfs``.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kombu
import pytest
from manual_clock import ManualClock
from test_wb_transport_fs import consume, publish  # tests/unit is on sys.path

from flowengine.worker_based.broker import broadcast
from flowengine.worker_based.broker import transport_fs_disk as fsdisk

FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class Folder:
    """What the probes of a :class:`fsdisk.Disk` see: free blocks, read-only flag, writable."""

    def __init__(self) -> None:
        self.free_blocks, self.read_only, self.refuse = 1000, False, False

    def stat(self, _folder: str) -> Any:
        return SimpleNamespace(f_flag=os.ST_RDONLY if self.read_only else 0,
                               f_bavail=self.free_blocks, f_bfree=self.free_blocks,
                               f_frsize=4096)

    def probe(self, _folder: str, size: int) -> None:
        if self.read_only:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        if self.refuse or size > self.free_blocks * 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def folder_state() -> Folder:
    return Folder()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def make_disk(folder_state: Folder, clock: ManualClock) -> fsdisk.Disk:
    return fsdisk.Disk("/data", clock=clock, probe=folder_state.probe, stat=folder_state.stat)


def episode_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == fsdisk.__name__ and r.levelno >= logging.WARNING]


def test_an_episode_is_logged_once_when_it_starts_and_once_when_it_ends(
    folder_state: Folder, clock: ManualClock, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    disk = make_disk(folder_state, clock)
    for _ in range(50):  # fifty messages fail
        error = disk.failed(FULL)
    assert isinstance(error, OSError) and error.reported
    assert str(error) == "[Errno 28] flowengine-fs data folder /data is full (ENOSPC: No space " \
                         "left on device)"
    assert disk.unwritable and disk.problem is not None
    clock.advance(5.0)
    disk.succeeded()
    assert not disk.unwritable
    lines = episode_lines(caplog)
    assert len(lines) == 2, lines
    assert "is full (ENOSPC" in lines[0]
    assert "takes writes again after 5.0s (50 write(s) of this process failed" in lines[1]


def test_a_probe_starts_and_ends_an_episode_and_a_watch_sees_it_end_once(
    folder_state: Folder, clock: ManualClock,
) -> None:  # fmt: skip
    disk = make_disk(folder_state, clock)
    watch = fsdisk.Watch(disk)
    folder_state.read_only = True
    assert watch.unwritable
    assert "is read-only (EROFS" in (watch.problem or "")
    folder_state.read_only, folder_state.free_blocks = False, 1  # 4 KiB free: not over yet
    clock.advance(fsdisk.PROBE_INTERVAL)
    assert watch.unwritable
    folder_state.free_blocks, folder_state.refuse = 1000, True  # room, but writes still fail
    clock.advance(fsdisk.PROBE_INTERVAL)
    assert watch.unwritable
    folder_state.refuse = False
    clock.advance(fsdisk.PROBE_INTERVAL)
    assert not watch.unwritable
    assert watch.take() == pytest.approx(3 * fsdisk.PROBE_INTERVAL)
    assert watch.take() == 0.0


def test_a_file_system_that_reports_no_free_block_but_takes_writes_is_no_episode(
    folder_state: Folder, clock: ManualClock,
) -> None:  # fmt: skip
    folder_state.free_blocks = 0
    disk = fsdisk.Disk("/data", clock=clock, probe=lambda _folder, _size: None,
                       stat=folder_state.stat)
    assert disk.check() and not disk.unwritable
    full = make_disk(folder_state, clock)
    assert not full.check() and full.unwritable


def test_probes_are_rate_limited(folder_state: Folder, clock: ManualClock) -> None:
    calls: list[str] = []

    def stat(folder: str) -> Any:
        calls.append(folder)
        return folder_state.stat(folder)

    disk = fsdisk.Disk("/data", clock=clock, probe=folder_state.probe, stat=stat)
    for _ in range(100):
        assert disk.check()
    assert len(calls) == 1


def test_a_disk_that_flaps_soon_after_an_episode_is_not_logged_again(
    folder_state: Folder, clock: ManualClock, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    disk = make_disk(folder_state, clock)
    for _ in range(5):  # a large message fails where a probe found room
        disk.failed(FULL)
        clock.advance(1.0)
        disk.succeeded()
    assert len(episode_lines(caplog)) == 2
    clock.advance(fsdisk.QUIET_RESTART)
    disk.failed(FULL)
    assert len(episode_lines(caplog)) == 3


def test_only_full_quota_and_read_only_count_as_disk_errors() -> None:
    assert fsdisk.is_disk_error(OSError(errno.EROFS, "ro"))
    assert fsdisk.is_disk_error(OSError(errno.EDQUOT, "quota"))
    assert not fsdisk.is_disk_error(OSError(errno.ENOENT, "gone"))
    assert not fsdisk.is_disk_error(ValueError("no"))


def test_half_written_files_of_processes_now_gone_are_swept_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    (folder / "tmp").mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    mine = os.getpid()
    names = {f"00000000000000000001.{dead}.0000000001.msg": False,
             f"x.json.{dead}.140000": False, f"probe.{dead}.1": False,
             f"00000000000000000002.{mine}.0000000001.msg": True, f"x.json.{mine}.1": True,
             "somebody-elses-file": True}
    for name in names:
        (folder / "tmp" / name).write_bytes(b"half")
    with kombu.Connection("flowengine-fs://localhost",
                          transport_options={"data_folder": str(folder)}) as conn:
        publish(conn, [{"n": 1}])
        assert consume(conn, 1) == [{"n": 1}]
    assert sorted(os.listdir(folder / "tmp")) == sorted(n for n, kept in names.items() if kept)


def test_a_consumed_body_is_not_readable_on_disk_afterwards(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    with kombu.Connection("flowengine-fs://localhost",
                          transport_options={"data_folder": str(folder)}) as conn:
        publish(conn, [{"password": f"s3cret-{n}"} for n in range(200)])
        assert len(consume(conn, 200)) == 200
        leftovers = [path for path in folder.rglob("*") if path.is_file()
                     and b"s3cret" in path.read_bytes()]
        assert leftovers == []
        # The blanked files are still recycled: the next message reuses one.
        spares = list(folder.rglob("spare.*"))
        assert spares
        publish(conn, [{"n": "next"}])
        assert len(list(folder.rglob("spare.*"))) == len(spares) - 1


# -- clean exits leave nothing behind (issue 15, item 9) -------------------------------------


def test_a_listener_leaves_no_queue_and_no_claim_behind(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    options = {"data_folder": str(folder)}
    stream = broadcast.Broadcast("left.events", transport_options=options)
    heard: list[Any] = []

    def listening() -> None:
        stream.publish([{"n": n} for n in range(3)])

    for document in stream.listen(lambda: len(heard) == 3, ready=listening, poll=0.01):
        heard.append(document)
    stream.close()
    assert heard == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert os.listdir(folder / "queues") == []
    assert [p for p in (folder / "claimed").rglob("*.msg")] == []


def test_a_clean_exit_leaves_no_claim_and_nothing_is_requeued_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    folder = tmp_path / "data"
    script = f"""
import kombu, flowengine.worker_based.broker.transport_fs
x = kombu.Exchange("jobs", type="direct")
q = kombu.Queue("jobs_replies", x, routing_key="r")
with kombu.Connection("flowengine-fs://localhost",
                      transport_options={{"data_folder": {str(folder)!r}}}) as conn:
    conn.Producer(serializer="json").publish({{"n": 1}}, exchange=x, routing_key="r",
                                            declare=[q])
    got = []
    with conn.Consumer([q], callbacks=[lambda body, m: got.append(body)], no_ack=True):
        while not got:
            conn.drain_events(timeout=5)
    conn.Producer(serializer="json").publish({{"n": 2}}, exchange=x, routing_key="r")
    with conn.Consumer([q], callbacks=[lambda body, m: (got.append(body), m.ack())]):
        while len(got) < 2:
            conn.drain_events(timeout=5)
    # Looked at and given back, as `flowengine dead-letters list` does.
    kept = kombu.Queue("jobs_kept", x, routing_key="k")
    conn.Producer(serializer="json").publish({{"n": 3}}, exchange=x, routing_key="k",
                                            declare=[kept])
    kept(conn.default_channel).get().requeue()
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    # A clean exit leaves no claim folder (its emptied spares included).
    assert list((folder / "claimed").iterdir()) == []
    caplog.set_level(logging.WARNING)
    with kombu.Connection("flowengine-fs://localhost",
                          transport_options={"data_folder": str(folder)}) as conn:
        assert conn.default_channel.basic_get("jobs_replies") is None  # runs the recovery
    assert not any("ended holding" in r.getMessage() for r in caplog.records)
    assert [p for p in (folder / "claimed").rglob("*") if p.is_file()] == []


def test_settlements_a_read_only_disk_refuses_are_retried_in_order(
    folder_state: Folder, clock: ManualClock,
) -> None:  # fmt: skip
    disk = make_disk(folder_state, clock)
    later = fsdisk.Later(disk)
    done: list[str] = []
    read_only = True

    def settle(name: str) -> None:
        if read_only:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        done.append(name)

    assert not later.attempt(settle, "ack-1") and not later.attempt(settle, "requeue-2")
    assert later and disk.unwritable and done == []
    later.retry()
    assert later and done == []  # still refused: both kept
    read_only = False
    later.retry()
    assert not later and done == ["ack-1", "requeue-2"]
    with pytest.raises(ValueError):  # anything but the disk is the caller's
        later.attempt(lambda: (_ for _ in ()).throw(ValueError("bug")))
