"""Jobs posted with a lock, run by real conductor processes on Redis, ZooKeeper and etcd.

Every step writes its start and end to a ledger (``lock_flows``), so the tests read when each
job ran in which process: two jobs holding one lock never overlap, the next starts as soon as
the lock is free, a killed holder frees it within its lease plus 2 s, and a frozen holder woken
after its lease writes nothing more.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lock_flows
import pytest
from board_stage import BoardStage
from boards import wipe_etcd, wipe_redis, wipe_zookeeper
from conductor_procs import ROOT, Conductor, conductors, wait_for
from servers import require_module

from flowengine import states
from flowengine.jobs.base import Job
from flowengine.jobs.posting import post_flow

# Real servers and conductor processes, leases left to lapse: 10-40 s each on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
__all__ = ["conductors"]

#: The locks' lease: long enough for a loaded machine's ZooKeeper session, short for the tests.
LOCK_TTL = 3.0
LOCK = "lb:1234"


def _etcd_wipe(endpoint: tuple[str, int], namespace: str) -> None:
    import etcd3gw

    wipe_etcd(endpoint, namespace)
    client = etcd3gw.Etcd3Client(host=endpoint[0], port=endpoint[1], timeout=10)
    client.delete_prefix(f"/taskflow/.coordination/{namespace}/")


@pytest.fixture(params=["redis", "zookeeper", "etcd"])
def make_stage(request: pytest.FixtureRequest,
               tmp_path: Path) -> Iterator[Callable[..., BoardStage]]:
    """Makes the stage (board, persistence, ledger) of the backend, with the options given."""
    backend = str(request.param)
    made: list[BoardStage] = []
    namespace = f"fe-locks-{uuid.uuid4().hex[:10]}"
    wipe: Callable[[], None]
    if backend == "redis":
        require_module("redis")
        url = request.getfixturevalue("redis_url")
        board_uri = url
        extra: dict[str, Any] = {"namespace": namespace}
        wipe = lambda: wipe_redis(url, namespace)  # noqa: E731
    elif backend == "zookeeper":
        require_module("kazoo")
        hosts = request.getfixturevalue("zookeeper_hosts")
        board_uri, extra = f"zookeeper://{hosts}/{namespace}/jobs", {}
        wipe = lambda: wipe_zookeeper(hosts, namespace)  # noqa: E731
    else:
        require_module("etcd3gw")
        endpoint = request.getfixturevalue("etcd_endpoint")
        board_uri, extra = f"etcd://{endpoint[0]}:{endpoint[1]}/{namespace}", {}
        wipe = lambda: _etcd_wipe(endpoint, namespace)  # noqa: E731

    def make(**options: Any) -> BoardStage:
        stage = BoardStage(board_uri, {**extra, "lock_ttl": LOCK_TTL, **options}, tmp_path, wipe)
        made.append(stage)
        return stage

    yield make
    for stage in made:
        stage.close()


def _post(stage: BoardStage, label: str, on_conflict: str = "wait", **store: Any) -> Job:
    return post_flow(stage.board, stage.persistence, lock_flows.held,
                     store={"ledger": str(stage.ledger), "job": label, **store},
                     details={"locks": [LOCK], "on_conflict": on_conflict}, name=label)


def _waiting(conductor: Conductor) -> Callable[[], bool]:
    return lambda: "waits for lock" in conductor.output()


def _held_and_awaited(stage: BoardStage, conductors: list[Conductor],
                      gated_step: str) -> tuple[Conductor, Job, Conductor, Job]:
    """A conductor holding the lock for job ``one`` (waiting in ``gated_step``), and another
    whose job ``two`` waits for it."""
    holder = stage.conductor(conductors, "holder")
    stage.wait_registered(holder)
    one = _post(stage, "one", gate=str(stage.gate), gated_step=gated_step)
    wait_for(Path(f"{stage.gate}.waiting").exists, 60,
             f"job one waiting in {gated_step}\n{holder.output()}")
    waiter = stage.conductor(conductors, "waiter")
    two = _post(stage, "two")
    wait_for(_waiting(waiter), 60, f"the waiter waiting for the lock\n{waiter.output()}")
    return holder, one, waiter, two


def test_jobs_holding_one_lock_never_overlap_and_the_next_starts_at_once(
        make_stage: Callable[..., BoardStage], conductors: list[Conductor]) -> None:
    stage = make_stage(claim_ttl=10.0)
    first, second = (stage.conductor(conductors, name) for name in ("first", "second"))
    stage.wait_registered(first)
    stage.wait_registered(second)
    one = _post(stage, "one", hold=1.0)
    two = _post(stage, "two", hold=1.0)
    # Each conductor runs one job at a time, so each took one: one of them waited.
    wait_for(lambda: _waiting(first)() or _waiting(second)(), 60,
             f"a conductor waiting for the lock\n{first.output()}\n{second.output()}")
    assert one.wait(timeout=60), first.output() + second.output()
    assert two.wait(timeout=60), first.output() + second.output()
    spans = sorted(lock_flows.intervals(stage.ledger).values())
    assert len(spans) == 2, lock_flows.lines(stage.ledger)
    (_, first_end), (second_start, _) = spans
    assert first_end <= second_start, f"the jobs overlapped: {spans}"
    assert second_start - first_end < 1.0, f"the second started {second_start - first_end:.2f}s" \
                                           f" after the first ended"
    assert len({line.pid for line in lock_flows.lines(stage.ledger)}) == 2


def test_a_killed_holder_frees_the_lock_within_its_lease_plus_2s(
        make_stage: Callable[..., BoardStage], conductors: list[Conductor]) -> None:
    stage = make_stage(claim_ttl=10.0)
    holder, one, waiter, two = _held_and_awaited(stage, conductors, "hold-1")
    holder.signal(signal.SIGKILL)
    killed_at = time.time()  # the ledger's clock
    stage.gate.touch()
    assert two.wait(timeout=60), waiter.output()
    started = min(line.at for line in lock_flows.lines(stage.ledger)
                  if line.job == "two" and line.event == "start")
    assert started - killed_at < LOCK_TTL + 2.0, f"the lock was freed {started - killed_at:.2f}s" \
                                                 f" after its holder was killed"
    # The killed holder's job is taken over (its claim lapsed) and finished, under the lock.
    assert one.wait(timeout=60), waiter.output()


def test_a_frozen_holder_woken_after_its_lease_writes_nothing(
        make_stage: Callable[..., BoardStage], conductors: list[Conductor]) -> None:
    # Claims outlive the freeze: only the lock's lease lapses.
    stage = make_stage(claim_ttl=60.0)
    frozen, one, waiter, two = _held_and_awaited(stage, conductors, "hold-2")
    frozen.signal(signal.SIGSTOP)
    # The frozen holder's lease lapses and the waiter gets the lock.
    assert two.wait(timeout=60), waiter.output()
    before = stage.flow_states(one)
    assert before["hold-2"] == states.RUNNING, before
    stage.gate.touch()
    frozen.signal(signal.SIGCONT)
    wait_for(lambda: "Refused to store" in frozen.output(), 30,
             f"the woken holder refusing its writes\n{frozen.output()}")
    assert stage.flow_states(one) == before, frozen.output()
    ran = [(line.event, line.step) for line in lock_flows.lines(stage.ledger)
           if line.job == "one" and line.pid == frozen.pid]
    # It finished the step it was in (its code ran on) but stored nothing and started nothing.
    assert ("start", "hold-3") not in ran, ran
    assert "Traceback" not in frozen.output(), frozen.output()
    # Handed back, the job is run again from what is stored, under the lock.
    assert one.wait(timeout=90), frozen.output() + waiter.output()
    assert stage.flow_states(one)["flow"] == states.SUCCESS


def test_a_job_posted_to_reject_a_held_lock_is_trashed_saying_who_holds_it(
        make_stage: Callable[..., BoardStage], conductors: list[Conductor]) -> None:
    stage = make_stage(claim_ttl=10.0)
    holder = stage.conductor(conductors, "holder")
    stage.wait_registered(holder)
    one = _post(stage, "one", gate=str(stage.gate), gated_step="hold-1")
    wait_for(Path(f"{stage.gate}.waiting").exists, 60, f"job one running\n{holder.output()}")
    refused = subprocess.run(
        [sys.executable, "-m", "flowengine.cli.main", "jobs", "post", "--board",
         stage.board_uri, *(f"--board-option={k}={v}" for k, v in stage.options.items()),
         "--backend", stage.backend_uri, "lock_flows:held", "--lock", LOCK,
         "--on-conflict", "reject", "--store", f"ledger={stage.ledger}", "--store", "job=cli"],
        capture_output=True, text=True, cwd=stage.workdir, timeout=60,
        env={"PYTHONPATH": f"{Path(__file__).parent}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert refused.returncode != 0, refused.stdout
    assert "not posted (--on-conflict reject)" in refused.stderr, refused.stderr
    assert f"{LOCK} by job {one.uuid}" in refused.stderr, refused.stderr
    rejecter = stage.conductor(conductors, "rejecter")
    two = _post(stage, "two", on_conflict="reject")
    assert two.wait(timeout=60), rejecter.output()
    [trashed] = stage.board.iter_trash()
    assert trashed.uuid == two.uuid
    assert f"rejected: The lock {LOCK!r} is held by job {one.uuid}" in trashed.reason
    stage.gate.touch()
    assert one.wait(timeout=60), holder.output()
    assert {line.job for line in lock_flows.lines(stage.ledger)} == {"one"}
