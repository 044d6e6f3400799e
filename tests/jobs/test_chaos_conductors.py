"""``flowengine chaos --board``, as a user runs it: the example order flow posted as jobs on a
real board (Redis, ZooKeeper), run by three conductor processes on three worker processes (a
Redis broker), while the seeded schedule kills, freezes past their claim and restarts the
conductors as well as the workers. Certified: every job consumed with its flow SUCCESS or
REVERTED, none left claimed, trashed or lost, no completed atom run again, every fault
recovered.

CI runs each for 25 seconds of chaos (the 120-second run is made by hand; doc/proving.rst gives
its figures), with the tool's defaults: a conductor's freeze (past its 5 s claim) outlasts its
engines' 5 s lease on a worker's request, so it wakes with its running requests' leases lapsed
and must send none of them again. Each session's work folder is in the test's tmp_path, quoted
on failure; what the session left on the board and the broker is removed.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import boards
import pytest
from servers import require_module

# 25 s of chaos, the jobs given up to 90 s to end (the session stops as soon as they have): about
# 50 s each on a loaded 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
#: Seconds of chaos; the seed fixes the schedule (each of the six kinds of fault in 25 s).
DURATION = 25
SEED = 7
#: Seconds the jobs get to end after the chaos. More than the engines' 60 s transition timeout:
#: a request Redis pops for a worker as it is killed is lost (kombu records it only once the
#: worker has it), and its engine finds out only when that timeout ends, then runs it again.
SETTLE = 90
BOARD_KINDS = {"kill-worker", "freeze-worker", "restart-worker", "kill-conductor",
               "freeze-conductor", "restart-conductor"}


def forget_exchange(url: str, exchange: str) -> None:
    """Delete what the session's exchange left on the Redis broker (its queues, bindings)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        for pattern in (f"{exchange}*", f"_kombu.binding*.{exchange}"):
            keys = list(client.scan_iter(match=pattern, count=500))
            if keys:
                client.delete(*keys)
    finally:
        client.close()


def chaos(broker_url: str, board: str, workdir: pathlib.Path,
          wipe: Callable[[str], None]) -> dict[str, Any]:
    """Run a session on ``board``; return its certificate (``wipe`` gets the location of the
    session's jobs on the board, to remove them)."""
    exchange = f"chaos-ci-{uuid.uuid4().hex[:8]}"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "flowengine.cli.main", "chaos", "chaos_orders:order_flow",
             "--duration", str(DURATION), "--workers", "3", "--seed", str(SEED),
             "--url", broker_url, "--exchange", exchange, "--board", board,
             "--conductors", "3",
             "--workdir", str(workdir), "--settle", str(SETTLE), "--json"],
            cwd=EXAMPLES, capture_output=True, text=True, timeout=DURATION + SETTLE + 180)
    finally:
        forget_exchange(broker_url, exchange)
    try:
        certificate: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no certificate:\n{proc.stdout}\n{proc.stderr}") from None
    wipe(certificate["jobs"]["under"])
    assert proc.returncode == 0 and certificate["passed"], (
        f"not certified: {why_not(certificate)}\n{proc.stderr[-3000:]}")
    return certificate


def why_not(certificate: dict[str, Any]) -> dict[str, Any]:
    """What a certificate holds against the run, alone (the whole one is long enough for a
    test report to cut off the part that matters)."""
    jobs = certificate.get("jobs") or {}
    held = {key: certificate.get(key) for key in ("hung", "failed", "reran", "lost_work", "late")
            if certificate.get(key)}
    held.update({f"jobs.{key}": jobs[key] for key in ("left", "trashed", "lost", "overwritten")
                 if jobs.get(key)})
    held["ended"] = certificate.get("ended")
    held["jobs.ended"] = jobs.get("ended")
    held["unrecovered"] = [fault for fault in certificate.get("faults", [])
                           if fault.get("recovery") is None]
    return held


def assert_certified(certificate: dict[str, Any]) -> None:
    jobs = certificate["jobs"]
    assert {fault["kind"] for fault in certificate["faults"]} == BOARD_KINDS, certificate
    assert jobs["posted"] >= 20 and jobs["posted"] == certificate["flows"]
    assert set(jobs["ended"]) == {"SUCCESS", "REVERTED"}  # every 7th order declined
    assert sum(jobs["ended"].values()) == jobs["posted"]
    assert jobs["left"] == [] and jobs["trashed"] == [] and jobs["lost"] == []
    assert certificate["hung"] == [] and certificate["reran"] == []
    struck = [f for f in certificate["faults"]
              if f["kind"].endswith("-conductor") and f["affected"]]
    assert struck, certificate  # conductors were struck holding jobs, and those moved on
    assert certificate["conductor_worst_recovery"] is not None
    assert f"--seed {SEED}" in certificate["replay"] and "--board" in certificate["replay"]


def test_the_order_flow_is_certified_on_conductors_of_a_redis_board(
        redis_url: str, tmp_path: pathlib.Path) -> None:
    certificate = chaos(redis_url, redis_url, tmp_path / "chaos",
                        lambda namespace: boards.wipe_redis(redis_url, namespace))
    assert_certified(certificate)
    print(f"redis board: {json.dumps(certificate)}")  # the figures, for whoever reads the log


def test_the_order_flow_is_certified_on_conductors_of_a_zookeeper_board(
        redis_url: str, zookeeper_hosts: str, tmp_path: pathlib.Path) -> None:
    require_module("kazoo")
    certificate = chaos(redis_url, f"zookeeper://{zookeeper_hosts}/flowengine",
                        tmp_path / "chaos",
                        lambda path: boards.wipe_zookeeper(zookeeper_hosts, path))
    assert_certified(certificate)
    print(f"zookeeper board: {json.dumps(certificate)}")
