"""ZooKeeper jobboard: a lost session ends its claims at once, and the board recovers.

The session is really expired by the server: a second client joins it with its id and password
and closes it, which is how ZooKeeper's own tests end a session. Also: TaskFlow's board and
flowengine's read each other's jobs (same node layout).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from boards import wipe_zookeeper
from servers import require_module

require_module("kazoo")

from kazoo.client import KazooClient, KazooState  # noqa: E402
from taskflow_interop import check_boards_share_jobs  # noqa: E402

from flowengine import states  # noqa: E402
from flowengine.jobs import backends, base  # noqa: E402
from flowengine.types.entity import Entity  # noqa: E402


@pytest.fixture
def root(zookeeper_hosts: str) -> Iterator[str]:
    """A fresh ZooKeeper path, deleted afterwards."""
    name = f"fe-test-{uuid.uuid4().hex[:12]}"
    yield f"/{name}"
    wipe_zookeeper(zookeeper_hosts, name)


def _board(hosts: str, root: str, name: str, claim_ttl: float = 10,
           **kwargs: object) -> base.JobBoard:
    board = backends.fetch(name, {"board": "zookeeper", "hosts": hosts, "path": f"{root}/jobs",
                                  "claim_ttl": claim_ttl}, **kwargs)
    board.connect()
    return board


def _expire(client: KazooClient, hosts: str) -> None:
    """End ``client``'s session on the server, and return once ``client`` has a new one."""
    states_seen: list[str] = []
    renewed = threading.Event()

    def listen(state: str) -> None:
        states_seen.append(state)
        if state == KazooState.CONNECTED and KazooState.LOST in states_seen:
            renewed.set()

    client.add_listener(listen)
    session_id, password = client.client_id
    twin = KazooClient(hosts=hosts, client_id=(session_id, password))
    twin.start(timeout=15)
    twin.stop()
    twin.close()
    assert renewed.wait(30), f"no new session; states seen: {states_seen}"
    client.remove_listener(listen)
    assert client.client_id[0] != session_id


def test_a_lost_session_frees_its_claims_at_once(zookeeper_hosts: str, root: str) -> None:
    # A claim (and session) of 30 s: far longer than ending the session takes, even on a
    # loaded machine, so a claim freed before its own end was freed by the session's end.
    client = KazooClient(hosts=zookeeper_hosts, timeout=30)
    holder = _board(zookeeper_hosts, root, "holder", claim_ttl=30, client=client)
    other = _board(zookeeper_hosts, root, "other")
    try:
        job = holder.post("j")
        holder.claim(job, "c1")
        claimed_at = time.monotonic()
        [seen] = list(other.iterjobs(ensure_fresh=True))
        assert seen.state == states.CLAIMED
        _expire(client, zookeeper_hosts)
        [freed] = list(other.wait(timeout=25))
        assert freed.uuid == job.uuid
        assert time.monotonic() - claimed_at < holder.options.claim_ttl, (
            "freed only when the claim ran out: the session's end did not free it")
        with pytest.raises(base.ClaimLost, match="c1"):
            holder.keep_alive(job, "c1")
        other.claim(freed, "c2")
        assert other.find_owner(freed) == "c2" and freed.attempts == 2
        # The holder follows the board again with its new session.
        posted = other.post("after")
        assert posted.uuid in [j.uuid for j in holder.wait(timeout=10)]
    finally:
        holder.close()
        other.close()
        client.stop()
        client.close()


def test_registrations_come_back_with_a_new_session(zookeeper_hosts: str, root: str) -> None:
    client = KazooClient(hosts=zookeeper_hosts, timeout=10)
    holder = _board(zookeeper_hosts, root, "holder", client=client)
    other = _board(zookeeper_hosts, root, "other")
    try:
        holder.register_entity(Entity("conductor", "c1", {"pid": 1}))
        _expire(client, zookeeper_hosts)
        deadline = time.monotonic() + 10  # re-registered by the board's watch thread
        while not other.iter_entities("conductor") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [e.name for e in other.iter_entities("conductor")] == ["c1"]
    finally:
        holder.close()
        other.close()
        client.stop()
        client.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_taskflow_and_flowengine_boards_share_jobs(zookeeper_hosts: str, root: str) -> None:
    taskflow_backends = require_module("taskflow.jobs.backends")
    conf = {"board": "zookeeper", "hosts": zookeeper_hosts, "path": f"{root}/jobs",
            "check_compatible": False}
    theirs = taskflow_backends.fetch("taskflow", dict(conf))
    theirs.connect()
    ours = _board(zookeeper_hosts, root, "flowengine")
    try:
        check_boards_share_jobs(theirs, ours)
    finally:
        theirs.close()
        ours.close()
