"""Conductors on clustered boards lose the member that leads while one of them holds a job.

Real ``flowengine conductor`` processes are given a board URI naming every member: the
three-member ZooKeeper ensemble, the three-member etcd cluster (its leader listed first, so the
conductor talks to the member that is then killed), or the three Redis Sentinels. While the
first conductor runs step 2 of a job, the leader (ZooKeeper's and etcd's, Redis's master) is
killed with SIGKILL; a second conductor waits beside it. The job must end SUCCESS: the first
conductor keeps its claim and finishes, or it is fenced (its claim is gone after the failover)
and the second one takes the job on. Either way step 1, which completed before the kill, ran
once, and step 3 ran once. The time from the kill until the test's own client of the board sees the
job done is reported.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import cluster_servers as cs
import jobs_flows
import pytest
from board_stage import BoardStage
from boards import etcd_keys, wipe_etcd, wipe_redis, wipe_zookeeper
from conductor_procs import Conductor, conductors

from flowengine import states

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(240)]
__all__ = ["conductors"]

#: Long enough to ride out an election; the second conductor is there for when it is not.
CLAIM_TTL = 6.0


# Each: (stage, kill the leader, whether the cluster's members hold the board's records).
Board = tuple[BoardStage, Callable[[], None], Callable[[], bool]]


def _zookeeper(workdir: Path) -> Board:
    from kazoo.client import KazooClient

    namespace = f"fe-cluster-{uuid.uuid4().hex[:10]}"
    hosts = cs.zookeeper_hosts()
    stage = BoardStage(f"zookeeper://{hosts}/{namespace}/jobs", {"claim_ttl": CLAIM_TTL},
                       workdir, lambda: wipe_zookeeper(hosts, namespace))

    def on_the_ensemble() -> bool:
        client = KazooClient(hosts=hosts)
        client.start(timeout=15)
        try:
            return bool(client.exists(f"/{namespace}/jobs"))
        finally:
            client.stop()
            client.close()

    return stage, lambda: cs.kill_zookeeper(cs.zookeeper_leader()), on_the_ensemble


def _etcd(workdir: Path) -> Board:
    namespace = f"fe-cluster-{uuid.uuid4().hex[:10]}"
    leader = cs.etcd_leader()
    order = [leader] + [n for n in cs.NODES if n != leader]
    hosts = ",".join(f"127.0.0.1:{cs.ETCD_PORTS[n]}" for n in order)
    stage = BoardStage(f"etcd://{hosts}/{namespace}", {"claim_ttl": CLAIM_TTL}, workdir,
                       lambda: wipe_etcd(("127.0.0.1", cs.ETCD_PORTS[_alive_etcd()]), namespace))
    return stage, lambda: cs.kill_etcd(leader), lambda: bool(
        etcd_keys(("127.0.0.1", cs.ETCD_PORTS[_alive_etcd()]), namespace))


def _alive_etcd() -> int:
    return next(n for n in cs.NODES if cs.answers(cs.ETCD_PORTS[n]))


def _redis_sentinel(workdir: Path) -> Board:
    namespace = f"fe-cluster-{uuid.uuid4().hex[:10]}"
    sentinels = ",".join(f"127.0.0.1:{port}" for port in cs.SENTINEL_PORTS)
    stage = BoardStage(f"redis://{sentinels}/0?sentinel={cs.MASTER_NAME}",
                       {"namespace": namespace, "claim_ttl": CLAIM_TTL}, workdir,
                       lambda: wipe_redis(f"redis://127.0.0.1:{cs.redis_master_port()}/0",
                                          namespace))

    def on_the_master() -> bool:
        import redis

        client = redis.Redis(port=cs.redis_master_port())
        try:
            return bool(client.exists(f"{namespace}:jobs"))
        finally:
            client.close()

    return stage, lambda: cs.kill_redis(cs.redis_master_port()), on_the_master


BOARDS = {"zookeeper": _zookeeper, "etcd": _etcd, "redis-sentinel": _redis_sentinel}
#: The cluster script's name of each board's service.
SERVICES = {"zookeeper": "zookeeper", "etcd": "etcd", "redis-sentinel": "redis"}


@pytest.fixture(params=sorted(BOARDS))
def board(request: pytest.FixtureRequest, cluster: None,
          tmp_path: Path) -> Iterator[tuple[str, Board]]:
    """``(kind, (stage, kill the leader, records check))``, every member of the service running
    when the test starts (the one it kills stays down: see ``cluster_servers``)."""
    cs.restore(SERVICES[request.param])
    made = BOARDS[request.param](tmp_path)
    try:
        yield request.param, made
    finally:
        made[0].close()


def test_losing_the_leader_while_a_conductor_holds_a_job_ends_it_in_success(
        board: tuple[str, Board], conductors: list[Conductor]) -> None:
    kind, (stage, kill_leader, on_the_cluster) = board
    first = stage.conductor(conductors, "first")
    stage.wait_registered(first)
    job = stage.post(jobs_flows.steps, gate=str(stage.gate), gated_step="step-2")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=60)
    assert on_the_cluster(), "the board's records are not on the cluster's members"
    second = stage.conductor(conductors, "second")
    stage.wait_registered(second)

    kill_leader()
    killed = time.time()  # the ledger's clock
    stage.gate.touch()
    assert job.wait(timeout=90), first.output() + second.output()
    done = time.time()

    entries = jobs_flows.ledger_entries(stage.ledger)
    names = [name for name, _ in entries]
    assert names.count("step-1") == 1 and names.count("step-3") == 1, entries
    assert names[0] == "step-1" and names[-1] == "step-3", entries
    # Step 2 was running at the kill: it ran again only if its conductor was fenced.
    assert names.count("step-2") in (1, 2), entries
    assert stage.flow_states(job)["flow"] == states.SUCCESS
    cs.report(f"{kind} leader killed (job done, seen on the board)", done - killed,
              claim_ttl=CLAIM_TTL, handed_on=entries[-1][1] == second.pid)
