"""A rolling upgrade: four workers restarted one by one from version 1 to version 2 of their
task classes, on one topic, while engines of both versions run forty flows.

Workers of both versions share the topic's queue meanwhile, so requests of each version reach
workers of the other: those hand them back unrun and the engines send them again, only while a
worker of their own version lives. No flow fails, and the ledger the tasks write shows every
request ran on a worker of the major version its engine asked for.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from wbe_harness import HERE, REPO, Broker, WorkerFleet, WorkerProcess, subprocess_env

# Eight worker processes and two engine processes on a loaded machine: about a minute.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "hosts"
TASKS = ("rolling_tasks:Drain", "rolling_tasks:Reboot")
FLOWS = 20


def _engines(broker: Broker, exchange: str, version: int, ledger: Path,
             log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, str(HERE / "rolling_engines.py"), broker.url, exchange, TOPIC,
             f"v{version}", str(FLOWS), "4"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env=subprocess_env({"ROLLING_VERSION": str(version), "ROLLING_LEDGER": str(ledger)}))


def _ledger(ledger: Path) -> list[tuple[int, int, int, str, str]]:
    found = []
    for line in ledger.read_text().splitlines() if ledger.exists() else ():
        asked, served, pid, flow, task = line.split()
        found.append((int(asked), int(served), int(pid), flow, task))
    return found


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # another process's file: nothing to wait on
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s"
        time.sleep(0.05)


def _finished(engines: subprocess.Popen[bytes], log: Path) -> None:
    code = engines.wait(timeout=180)
    assert code == 0, log.read_text(errors="replace")


def test_a_rolling_restart_from_version_1_to_2_fails_no_flow(
        rabbitmq_broker: Broker, exchange: str, fleet_factory: Callable[..., WorkerFleet],
        tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    # Each version's workers log in a folder of their own (their names repeat).
    fleets = {version: fleet_factory(rabbitmq_broker, exchange, env={
        "ROLLING_VERSION": str(version), "ROLLING_LEDGER": str(ledger)}) for version in (1, 2)}
    (tmp_path / "v2").mkdir()
    fleets[2].log_dir = tmp_path / "v2"
    old = fleets[1].start(TOPIC, TASKS, count=4, threads=4)
    logs = {version: tmp_path / f"engines-v{version}.log" for version in (1, 2)}
    old_engines = _engines(rabbitmq_broker, exchange, 1, ledger, logs[1])
    _wait_for(lambda: any(line[0] == 1 for line in _ledger(ledger)), "a version-1 flow running")
    new: list[WorkerProcess] = []
    new_engines = None
    for worker in old[:3]:
        new += fleets[2].start(TOPIC, TASKS)
        if new_engines is None:  # engines of the new code start once a new worker is up
            new_engines = _engines(rabbitmq_broker, exchange, 2, ledger, logs[2])
        assert worker.stop() == 0, worker.failure("did not stop cleanly")
    # The last worker of the old code goes once the old code's engines are done: their
    # requests would have nowhere to run after it (they would fail naming version 2.0).
    _finished(old_engines, logs[1])
    new += fleets[2].start(TOPIC, TASKS)
    assert old[3].stop() == 0, old[3].failure("did not stop cleanly")
    assert new_engines is not None
    _finished(new_engines, logs[2])
    runs = _ledger(ledger)
    pids = {1: {w.pid for w in old}, 2: {w.pid for w in new}}
    wrong = [line for line in runs if line[0] != line[1] or line[2] not in pids[line[0]]]
    assert wrong == [], wrong
    done = {(flow, task) for _, _, _, flow, task in runs}
    assert done == {(f"v{v}-{i}", task) for v in (1, 2) for i in range(FLOWS)
                    for task in ("drain", "reboot", "undrain")}
    # Both versions ran side by side: the restart happened while flows ran.
    assert {line[1] for line in runs if line[3].startswith("v1-")} == {1}
    assert len({line[2] for line in runs if line[0] == 2}) > 1


def test_a_request_nobody_serves_at_its_version_fails_naming_the_versions_on_offer(
        rabbitmq_broker: Broker, exchange: str, fleet_factory: Callable[..., WorkerFleet],
        tmp_path: Path) -> None:
    from flowengine import engines
    from flowengine import exceptions as exc

    fleet = fleet_factory(rabbitmq_broker, exchange, env={
        "ROLLING_VERSION": "2", "ROLLING_LEDGER": str(tmp_path / "ledger")})
    [worker] = fleet.start(TOPIC, TASKS)
    listed = subprocess.run(
        [sys.executable, "-m", "flowengine.cli.main", "workers", "--url", rabbitmq_broker.url,
         "--exchange", exchange, "--topic", TOPIC, "--wait", "3"],
        capture_output=True, text=True, timeout=60, env=subprocess_env())
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[3] == "VERSIONS" and row.split()[3] == "2.0", listed.stdout
    import rolling_tasks  # this process runs version 1 (no ROLLING_VERSION)

    assert rolling_tasks.VERSION == (1, 0)
    started = time.monotonic()
    with pytest.raises(exc.NotFound) as caught:
        engines.run(rolling_tasks.make_flow("old"), store={"flow": "old", "asked": 1},
                    **fleet.engine_options(TOPIC, engine="worker-based", unserved_timeout=1.0))
    assert time.monotonic() - started < 30  # failed fast, not after the request's timeout
    assert ("no live worker on topic(s) 'hosts' runs version 1.x of task class "
            "'rolling_tasks.Drain'") in str(caught.value)
    assert f"on offer: version 2.0 by {row.split()[0]}." in str(caught.value)
    # The engine never sent it: it knew the only worker runs another version.
    assert "Handing back" not in worker.log(500)
