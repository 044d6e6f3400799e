"""flowengine-fs under disk pressure: a real, private tmpfs goes full or read-only mid-flow.

Each test mounts a small tmpfs of its own as the data folder (root only: it fails under
``CI=true`` and is skipped elsewhere when mounting is refused), runs real ``flowengine worker``
processes on it and counts executions from the tasks' ledger (:mod:`fault_tasks`), which lives
outside the tmpfs. "Full" is another process's runaway writer taking every block as soon as
one frees up (settling a message frees the blocks of its file), "read-only" a remount.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Stage, wait_until
from servers import unavailable
from wbe_harness import WorkerProcess, subprocess_env

from flowengine import engines, exceptions, states
from flowengine.flows import linear_flow as lf
from flowengine.worker_based import client as wbc
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker import transport_fs_disk as fsdisk

# Slowest test here: 30 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "disk"
#: Seconds the data folder stays unwritable: many heartbeat intervals and lease lengths.
OUTAGE = 8.0
#: Heartbeats every half second: without the outage rule a lease would lapse within 2 s.
HEARTBEAT = 0.5
#: Lines a process may log about one episode: its start and its end.
LINES_PER_EPISODE = 2


class Tmpfs:
    """A private tmpfs mounted at ``mountpoint``; the data folder is ``mountpoint/data``."""

    def __init__(self, mountpoint: Path, size: str = "4m") -> None:
        self.mountpoint, self.data = mountpoint, mountpoint / "data"
        mountpoint.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                               str(mountpoint)], capture_output=True, text=True)
        if done.returncode != 0:
            unavailable(f"cannot mount a private tmpfs (root needed): {done.stderr.strip()}")
        self._stop_filling = threading.Event()
        self._filler: threading.Thread | None = None

    def options(self) -> dict[str, Any]:
        return {"transport": "flowengine-fs", "transport_options": {"data_folder": str(self.data)}}

    @contextlib.contextmanager
    def full(self) -> Iterator[None]:
        """The file system stays full while the block runs (a runaway writer), then empties."""
        filler = self.mountpoint / "filler"
        self._stop_filling.clear()
        ready = threading.Event()

        def fill() -> None:
            with open(filler, "wb", buffering=0) as out:
                while not self._stop_filling.is_set():
                    try:
                        out.write(b"\0" * 4096)
                    except OSError:  # full: take the next block the moment one frees up
                        ready.set()
                        self._stop_filling.wait(0.002)

        self._filler = threading.Thread(target=fill, name="disk-filler", daemon=True)
        self._filler.start()
        try:
            assert ready.wait(WAIT), "the tmpfs never filled up"
            yield
        finally:
            self._stop_filling.set()
            self._filler.join(WAIT)
            filler.unlink()

    @contextlib.contextmanager
    def read_only(self) -> Iterator[None]:
        """The file system is read-only while the block runs."""
        subprocess.run(["mount", "-o", "remount,ro", str(self.mountpoint)], check=True)
        try:
            yield
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(self.mountpoint)], check=True)

    def unmount(self) -> None:
        self._stop_filling.set()
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)

    def leftovers(self) -> list[str]:
        """Half-written files in tmp/ (none may stay)."""
        return sorted(os.listdir(self.data / "tmp"))


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    mounted = Tmpfs(tmp_path / "mnt")
    try:
        yield mounted
    finally:
        wbc.close_all()  # no broker client may go on looking for the folder
        mounted.unmount()


def _worker(tmpfs: Tmpfs, stage: Stage, tmp_path: Path, exchange: str) -> WorkerProcess:
    argv = [sys.executable, "-m", "flowengine.cli.main", "worker", "--no-events",
            "--transport", "flowengine-fs", "--transport-option", f"data_folder={tmpfs.data}",
            "--exchange", exchange, "--topic", TOPIC, "--task", ft.__name__, "--threads", "2",
            "--grace", "5"]
    worker = WorkerProcess("disk", argv, subprocess_env(stage.env), tmp_path / "worker.log", TOPIC)
    wait_until(lambda: f"consuming queue {exchange}_{TOPIC}" in worker.log()
               or not worker.alive, WAIT, "the worker consuming")
    assert worker.alive, worker.failure("exited")
    return worker


def _episode_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "flowengine-fs data folder" in line]


@pytest.mark.parametrize("condition", ["full", "read_only"])
def test_a_flow_waits_out_an_unwritable_data_folder_and_runs_each_task_once(
    condition: str, tmpfs: Tmpfs, stage: Stage, runs: EngineRuns, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    exchange = f"disk-{condition}"
    worker = _worker(tmpfs, stage, tmp_path, exchange)
    flow = lf.Flow("disk").add(ft.Step("first"), ft.Gate("g"), ft.Step("last"))
    engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                          transition_timeout=WAIT, heartbeat_interval=HEARTBEAT,
                          **tmpfs.options())
    caplog.set_level(logging.WARNING, logger=fsdisk.__name__)
    run = runs.start(engine)
    stage.ledger.wait_for("g", ft.EXECUTE_START)
    with getattr(tmpfs, condition)():
        # The task finishes while nothing can be written: its outcome (and heartbeats) wait.
        stage.gates.open("g")
        stage.ledger.wait_for("g", ft.EXECUTE_END)
        wait_until(lambda: _episode_lines(worker.log()), WAIT, "the worker seeing the episode")
        threading.Event().wait(OUTAGE)  # the outage itself, not a synchronisation
    assert run.join(WAIT, worker.log) is None, worker.log()
    assert engine.storage.get_flow_state() == states.SUCCESS
    # Nothing ran twice: the engine did not take the silence for a lost worker.
    for atom in ("first", "g", "last"):
        assert len(stage.ledger.starts(atom)) == 1, stage.ledger.dump()
    # Nor did the request go round: taken once, never handed back and taken again.
    assert len(re.findall(r"Task g\[\w+\] received", worker.log(10_000))) == 1, worker.log()
    # The condition is named once when it starts and once when it ends, per process.
    word = {"full": "full (ENOSPC", "read_only": "read-only (EROFS"}[condition]
    lines = _episode_lines(worker.log(10_000))
    assert len(lines) == LINES_PER_EPISODE and word in lines[0] and str(tmpfs.data) in lines[0], \
        worker.log()
    assert "takes writes again" in lines[1]
    engine_lines = [r.getMessage() for r in caplog.records if r.name == fsdisk.__name__]
    assert len(engine_lines) <= LINES_PER_EPISODE, engine_lines
    warnings = [line for line in worker.log(10_000).splitlines()
                if re.search(r" (WARNING|ERROR) ", line)]
    assert len(warnings) <= LINES_PER_EPISODE + 1, "\n".join(warnings)
    assert tmpfs.leftovers() == []
    assert worker.stop() == 0


def test_a_publish_that_cannot_be_written_in_time_names_the_disk_and_leaves_nothing(
    tmpfs: Tmpfs,
) -> None:
    proxy = px.Proxy("disk-publisher", "disk-publish", {}, **tmpfs.options())
    try:
        proxy.publish(pr.Notify(), "warmup")  # the queue and its folders exist
        with tmpfs.full(), pytest.raises(px.BrokerOutage) as raised:
            proxy.publish(pr.Notify(), "warmup", deadline=1.5)
    finally:
        proxy.close()
    text = str(raised.value)
    assert f"flowengine-fs data folder {tmpfs.data} is full (ENOSPC" in text, text
    assert "data folder is unwritable" in text and "broker is unreachable" not in text, text
    assert tmpfs.leftovers() == []


def test_a_flow_started_on_a_full_disk_fails_naming_the_disk(
    tmpfs: Tmpfs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setattr(wbc, "CONSUMER_START_TIMEOUT", 3.0)
    (tmpfs.data / "tmp").mkdir(parents=True)
    caplog.set_level(logging.WARNING, logger="flowengine")
    with tmpfs.full(), pytest.raises(exceptions.ExecutionFailure) as raised:
        engines.run(ft.Step("never"), engine="worker-based", exchange="disk-early",
                    topics=[TOPIC], **tmpfs.options())
    assert f"flowengine-fs data folder {tmpfs.data} is full (ENOSPC" in str(raised.value)
    assert tmpfs.leftovers() == []
    # One line for the episode, not one per attempt to start consuming.
    # The engine's and broker's lines only: a jobboard another test left open in this process
    # (the process-wide coordination board) may log its own troubles meanwhile.
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("flowengine.")
             and not r.name.startswith(("flowengine.jobs.", "flowengine.coordination"))]
    assert len(lines) <= LINES_PER_EPISODE, lines
