"""ZooKeeper claims as leases: their end is read from the server's clock, never the local one.

Unit tests drive :mod:`flowengine.jobs.backends._zookeeper_records` with a manual clock; the last
test runs boards whose local clocks are an hour apart against the real server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from boards import wipe_zookeeper
from manual_clock import ManualClock
from servers import require_module

from flowengine import states
from flowengine.jobs import backends

kazoo_states = require_module("kazoo.protocol.states")
rec = require_module("flowengine.jobs.backends._zookeeper_records")

SESSION = 0x1234


def _stat(mtime_ms: int, owner: int = 0, version: int = 0) -> Any:
    return kazoo_states.ZnodeStat(czxid=1, mzxid=1, ctime=mtime_ms, mtime=mtime_ms,
                                  version=version, cversion=0, aversion=0, ephemeralOwner=owner,
                                  dataLength=0, numChildren=0, pzxid=1)


def _claimed(mtime_ms: int, claim: dict[str, Any] | None, lock_session: int = SESSION) -> Any:
    data: dict[str, Any] = {"uuid": "u", "name": "j", "attempts": 1}
    if claim is not None:
        data["claim"] = claim
    return rec.Snapshot("/b/jobs/job0000000001", data, _stat(mtime_ms), {"owner": "alice"},
                        _stat(mtime_ms, owner=lock_session))


def test_the_server_clock_is_the_local_one_plus_the_offset_seen_on_a_write() -> None:
    wall = ManualClock(start=100.0)
    clock = rec.ServerClock(wall)
    clock.observe(mtime_ms=5_000_100, sent_at=100.0, received_at=100.2)  # server is +4900 s
    wall.advance(10)
    assert clock.now() == pytest.approx(5_000.1 + 10 - 0.1)


def test_a_claim_lasts_its_ttl_from_the_job_nodes_mtime() -> None:
    snap = _claimed(1_000_000, {"owner": "alice", "ttl": 2.0, "session": rec.session_hex(SESSION)})
    assert snap.lease_end() == pytest.approx(1002.0)
    assert snap.live_owner(now=1001.9) == "alice"
    assert snap.live_owner(now=1002.0) is None


def test_a_lock_without_a_matching_claim_lasts_as_long_as_its_session() -> None:
    taskflows = _claimed(1_000_000, None)  # TaskFlow's conductors write no claim entry
    stale = _claimed(1_000_000, {"owner": "alice", "ttl": 2.0, "session": "dead"})
    for snap in (taskflows, stale):
        assert snap.lease_end() is None and snap.live_owner(now=10**9) == "alice"


def test_waiters_wake_once_when_a_known_lease_ends() -> None:
    wall = ManualClock(start=1000.0)
    timers = rec.LeaseTimers(rec.ServerClock(wall))
    timers.note(_claimed(1_002_000, {"owner": "alice", "ttl": 3.0,
                                     "session": rec.session_hex(SESSION)}))  # ends at 1005
    assert timers.next_wakeup() == pytest.approx(5.005)
    wall.advance(5.1)
    assert timers.next_wakeup() == 0.0  # it just ended: look now
    assert timers.next_wakeup() is None  # and only once


@pytest.fixture
def namespace(zookeeper_hosts: str) -> Iterator[str]:
    name = f"fe-test-{uuid.uuid4().hex[:12]}"
    yield name
    wipe_zookeeper(zookeeper_hosts, name)


def test_boards_whose_clocks_disagree_agree_on_a_claim(zookeeper_hosts: str,
                                                       namespace: str) -> None:
    conf = {"board": "zookeeper", "hosts": zookeeper_hosts, "path": f"/{namespace}/jobs",
            "claim_ttl": 1.0}
    ahead = backends.fetch("ahead", conf, wall_clock=lambda: time.time() + 3600)
    behind = backends.fetch("behind", conf, wall_clock=lambda: time.time() - 3600)
    ahead.connect()
    behind.connect()
    try:
        job = ahead.post("j")
        ahead.claim(job, "alice")
        claimed_at = time.monotonic()
        [seen] = list(behind.iterjobs(ensure_fresh=True))
        assert job.state == seen.state == states.CLAIMED  # an hour of skew changes nothing
        [freed] = list(behind.wait(timeout=10))  # and the claim ends after its 1 s, for both
        assert time.monotonic() - claimed_at >= 0.9 and freed.uuid == job.uuid
        assert job.state == states.UNCLAIMED
    finally:
        ahead.close()
        behind.close()


def test_bad_conf_and_an_unreachable_server_are_named(zookeeper_hosts: str) -> None:
    from flowengine import exceptions as exc

    with pytest.raises(ValueError, match="'jobs'"):
        backends.fetch("b", {"board": "zookeeper", "hosts": zookeeper_hosts, "path": "jobs"})
    with pytest.raises(TypeError, match="hosts"):
        backends.fetch("b", {"board": "zookeeper", "hosts": 42})
    board = backends.fetch("b", "zookeeper://127.0.0.1:1/taskflow/jobs")
    with pytest.raises(exc.JobFailure, match="127.0.0.1:1"):
        board.connect(timeout=0.5)  # type: ignore[call-arg]
    assert not board.connected
