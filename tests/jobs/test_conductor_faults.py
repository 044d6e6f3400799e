"""Conductor processes on Redis that are killed, frozen, crashed and cut off.

Each test runs real ``flowengine conductor`` processes sharing a SQLite persistence file and a
Redis board (claims of 2 s), and counts task executions in a ledger file. Integration tests.
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs_flows
import pytest
from boards import make_redis_board, wipe_redis
from conductor_procs import Conductor, PrivateRedis, conductors, private_redis, wait_for

from flowengine import states
from flowengine.jobs.base import JobBoard
from flowengine.jobs.posting import post_flow
from flowengine.persistence.backends import impl_sqlalchemy

pytestmark = pytest.mark.integration
__all__ = ["conductors", "private_redis"]  # fixtures, imported for pytest

CLAIM_TTL = 2.0


class Stage:
    """One test's board, persistence and conductor factory."""

    def __init__(self, redis_url: str, workdir: Path, **options: Any) -> None:
        self.redis_url, self.workdir = redis_url, workdir
        self.options = {"namespace": f"fe-faults-{uuid.uuid4().hex[:10]}",
                        "claim_ttl": CLAIM_TTL, **options}
        self.backend_uri = f"sqlite:///{workdir / 'flows.db'}"
        self.persistence = impl_sqlalchemy.SQLAlchemyBackend({"connection": self.backend_uri})
        with contextlib.closing(self.persistence.get_connection()) as conn:
            conn.upgrade()
        self.board: JobBoard = make_redis_board(redis_url, name="test", **self.options)
        self.board.connect()
        self.ledger, self.gate = workdir / "ledger", workdir / "gate"

    def post(self, factory: Any, **store: Any) -> Any:
        return post_flow(self.board, self.persistence, factory,
                         store={"ledger": str(self.ledger), **store})

    def conductor(self, started: list[Conductor], name: str) -> Conductor:
        conductor = Conductor(name, self.redis_url, self.options, self.backend_uri,
                              self.workdir)
        started.append(conductor)
        return conductor

    def wait_registered(self, conductor: Conductor, timeout: float = 30.0) -> None:
        wait_for(lambda: any(e.name.startswith(f"{conductor.name}@")
                             for e in self.board.iter_entities("conductor")),
                 timeout, f"registration of {conductor.name}\n{conductor.output()}")

    def close(self) -> None:
        self.board.close()
        self.persistence.close()
        wipe_redis(self.redis_url, self.options["namespace"])


@pytest.fixture
def stage(redis_url: str, tmp_path: Path) -> Iterator[Stage]:
    made = Stage(redis_url, tmp_path)
    yield made
    made.close()


def _by(entries: list[tuple[str, int]], pid: int) -> list[str]:
    return [name for name, who in entries if who == pid]


def test_kill_9_mid_flow_another_conductor_finishes_without_rerunning(
        stage: Stage, conductors: list[Conductor]) -> None:
    pair = [stage.conductor(conductors, name) for name in ("left", "right")]
    for conductor in pair:
        stage.wait_registered(conductor)
    job = stage.post(jobs_flows.steps, gate=str(stage.gate), gated_step="step-2")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
    [first] = [c for c in pair if c.name == stage.board.find_owner(job)]
    [second] = [c for c in pair if c is not first]
    first.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    stage.gate.touch()
    assert job.wait(timeout=30), second.output()
    took = time.monotonic() - killed_at
    entries = jobs_flows.ledger_entries(stage.ledger)
    assert [name for name, _ in entries] == ["step-1", "step-2", "step-3"]
    assert _by(entries, first.pid) == ["step-1"] and _by(entries, second.pid) == [
        "step-2", "step-3"]
    assert took < CLAIM_TTL + 2.0, f"failover took {took:.2f}s"


def test_a_conductor_frozen_past_its_claim_runs_no_further_atom(
        stage: Stage, conductors: list[Conductor]) -> None:
    first = stage.conductor(conductors, "frozen")
    stage.wait_registered(first)
    job = stage.post(jobs_flows.steps, gate=str(stage.gate), gated_step="step-2")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
    first.signal(signal.SIGSTOP)
    Path(f"{stage.gate}.waiting").unlink()
    second = stage.conductor(conductors, "rescuer")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)  # took over
    stage.gate.touch()
    assert job.wait(timeout=30), second.output()
    first.signal(signal.SIGCONT)
    wait_for(lambda: "lost the claim" in first.output(), 30, "the woken conductor giving up")
    entries = jobs_flows.ledger_entries(stage.ledger)
    # The atom it was running when frozen finishes; its result is refused and nothing follows.
    assert _by(entries, first.pid) == ["step-1", "step-2"]
    assert _by(entries, second.pid) == ["step-2", "step-3"]
    assert first.process.poll() is None  # alive, and free for other jobs


def test_a_job_that_crashes_its_conductor_every_time_is_trashed(
        redis_url: str, tmp_path: Path, conductors: list[Conductor]) -> None:
    stage = Stage(redis_url, tmp_path, max_attempts=2)
    try:
        job = stage.post(jobs_flows.crashing)
        for round_ in range(2):
            crashing = stage.conductor(conductors, f"crash-{round_}")
            assert crashing.process.wait(60) == 17, crashing.output()
        survivor = stage.conductor(conductors, "survivor")
        assert job.wait(timeout=30), survivor.output()
        [trashed] = stage.board.iter_trash()
        assert trashed.uuid == job.uuid and "orphaned 2 times" in trashed.reason
        assert jobs_flows.ledger_lines(stage.ledger) == ["before", "crash", "crash"]
    finally:
        stage.close()


def test_a_redis_restart_is_survived(private_redis: PrivateRedis, tmp_path: Path,
                                     conductors: list[Conductor]) -> None:
    stage = Stage(private_redis.url, tmp_path, claim_ttl=10.0)
    try:
        first = stage.conductor(conductors, "steady")
        stage.wait_registered(first)
        job = stage.post(jobs_flows.steps, gate=str(stage.gate), gated_step="step-2")
        jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
        private_redis.stop()
        private_redis.start()
        stage.gate.touch()
        assert job.wait(timeout=30), first.output()
        assert jobs_flows.ledger_lines(stage.ledger) == ["step-1", "step-2", "step-3"]
        later = stage.post(jobs_flows.steps, factory_args=(1,))  # still taking new jobs
        assert later.wait(timeout=30), first.output()
        private_redis.stop()  # and again while it waits, idle, for jobs
        private_redis.start()
        last = stage.post(jobs_flows.steps, factory_args=(1,))
        assert last.wait(timeout=30), first.output()
        assert job.state == states.COMPLETE and first.process.poll() is None
    finally:
        stage.close()
