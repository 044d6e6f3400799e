"""Conductor processes on Redis that are killed, frozen, crashed and cut off.

Each test runs real ``flowengine conductor`` processes sharing a SQLite persistence file and a
Redis board (claims of 2 s), and counts task executions in a ledger file. Integration tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs_flows
import pytest
from board_stage import (
    BoardStage,
    test_a_board_outage_longer_than_the_claim_reverts_nothing,
    test_a_conductor_cut_off_from_its_board_mid_step_reverts_nothing,
    test_a_conductor_frozen_past_its_claim_runs_no_further_atom,
    test_kill_9_mid_flow_another_conductor_finishes_without_rerunning,
)
from boards import wipe_redis
from conductor_procs import Conductor, PrivateRedis, conductors, private_redis, wait_for
from private_postgres import PrivatePostgres, private_postgres

from flowengine import states

# Real server and conductor processes, a claim left to lapse: 10-40 s each on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
# Fixtures and the tests every backend passes, imported for pytest.
__all__ = ["conductors", "private_postgres", "private_redis",
           "test_a_conductor_frozen_past_its_claim_runs_no_further_atom",
           "test_kill_9_mid_flow_another_conductor_finishes_without_rerunning",
           "test_a_board_outage_longer_than_the_claim_reverts_nothing",
           "test_a_conductor_cut_off_from_its_board_mid_step_reverts_nothing"]

CLAIM_TTL = 2.0


def _stage(redis_url: str, workdir: Path, backend_uri: str | None = None,
           **options: Any) -> BoardStage:
    """A stage on the Redis at ``redis_url``, keyed under a namespace of its own."""
    namespace = f"fe-faults-{uuid.uuid4().hex[:10]}"
    return BoardStage(redis_url, {"namespace": namespace, "claim_ttl": CLAIM_TTL, **options},
                      workdir, lambda: wipe_redis(redis_url, namespace), backend_uri)


@pytest.fixture
def stage(redis_url: str, tmp_path: Path) -> Iterator[BoardStage]:
    made = _stage(redis_url, tmp_path)
    yield made
    made.close()


def test_a_job_that_crashes_its_conductor_every_time_is_trashed(
        redis_url: str, tmp_path: Path, conductors: list[Conductor]) -> None:
    stage = _stage(redis_url, tmp_path, max_attempts=2)
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
    stage = _stage(private_redis.url, tmp_path, claim_ttl=10.0)
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


def test_a_conductor_that_loses_its_database_halts_and_the_job_finishes_later(
        redis_url: str, private_postgres: PrivatePostgres, tmp_path: Path,
        conductors: list[Conductor]) -> None:
    """The persistence database stops while a conductor runs step 2: the engine halts (nothing
    reverted, nothing more written), the job is handed back without counting an attempt, and
    once the database is back the job is resumed from what is stored and ends SUCCESS."""
    stage = _stage(redis_url, tmp_path, backend_uri=private_postgres.url, claim_ttl=10.0)
    try:
        conductor = stage.conductor(conductors, "steady")
        stage.wait_registered(conductor)
        job = stage.post(jobs_flows.undoable_steps, gate=str(stage.gate), gated_step="step-2")
        jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
        private_postgres.stop()
        stage.gate.touch()
        wait_for(lambda: "halted (nothing reverted)" in conductor.output(), 30,
                 f"the conductor halting\n{conductor.output()}")
        private_postgres.start()
        assert job.wait(timeout=60), conductor.output()
        entries = [name for name, _ in jobs_flows.ledger_entries(stage.ledger)]
        assert entries == ["step-1", "step-2", "step-2", "step-3"], conductor.output()
        assert stage.flow_states(job)["flow"] == states.SUCCESS
        assert "Traceback" not in conductor.output(), conductor.output()
    finally:
        stage.close()
