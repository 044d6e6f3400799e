"""Conductor processes on a ZooKeeper board, killed, frozen, and cut off from their session.

Real ``flowengine conductor`` processes share a SQLite file and a ZooKeeper board (claims of
2 s) under a path of the test's own; a ledger counts task executions (see ``board_stage``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import jobs_flows
import pytest
from board_stage import (
    BoardStage,
    test_a_board_outage_longer_than_the_claim_reverts_nothing,
    test_a_conductor_cut_off_from_its_board_mid_step_reverts_nothing,
    test_a_conductor_frozen_past_its_claim_runs_no_further_atom,
    test_kill_9_mid_flow_another_conductor_finishes_without_rerunning,
)
from boards import wipe_zookeeper
from conductor_procs import Conductor, conductors, wait_for
from servers import require_module

require_module("kazoo")

# Real server and conductor processes, a claim left to lapse: 10-40 s each on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
# A fixture and the tests every backend passes, imported for pytest.
__all__ = ["conductors", "test_a_conductor_frozen_past_its_claim_runs_no_further_atom",
           "test_kill_9_mid_flow_another_conductor_finishes_without_rerunning",
           "test_a_board_outage_longer_than_the_claim_reverts_nothing",
           "test_a_conductor_cut_off_from_its_board_mid_step_reverts_nothing"]

CLAIM_TTL = 2.0


def _stage(hosts: str, workdir: Path, **options: object) -> BoardStage:
    namespace = f"fe-faults-{uuid.uuid4().hex[:10]}"
    return BoardStage(f"zookeeper://{hosts}/{namespace}/jobs",
                      {"claim_ttl": CLAIM_TTL, **options}, workdir,
                      lambda: wipe_zookeeper(hosts, namespace))


@pytest.fixture
def stage(zookeeper_hosts: str, tmp_path: Path) -> Iterator[BoardStage]:
    made = _stage(zookeeper_hosts, tmp_path)
    yield made
    made.close()


def test_a_conductor_whose_session_expired_comes_back(
        zookeeper_hosts: str, tmp_path: Path, conductors: list[Conductor]) -> None:
    from kazoo.client import KazooClient

    # A 2 s session: frozen for longer, the conductor finds it expired when it wakes.
    stage = _stage(zookeeper_hosts, tmp_path, timeout=CLAIM_TTL)
    watcher = KazooClient(hosts=zookeeper_hosts)
    watcher.start(timeout=15)
    try:
        conductor = stage.conductor(conductors, "sleeper")
        stage.wait_registered(conductor)
        registrations = stage.board.entity_path + "/conductor"  # type: ignore[attr-defined]
        conductor.freeze()
        # Its ephemeral registration node goes only when ZooKeeper ends the session.
        wait_for(lambda: not watcher.get_children(registrations), 30,
                 "the frozen conductor's session ending")
        conductor.thaw()
        wait_for(lambda: "lost its ZooKeeper session" in conductor.output(), 30,
                 f"the conductor noticing\n{conductor.output()}")
        stage.wait_registered(conductor)  # a new session, registered again
        job = stage.post(jobs_flows.steps)
        assert job.wait(timeout=30), conductor.output()
        assert jobs_flows.ledger_lines(stage.ledger) == ["step-1", "step-2", "step-3"]
        assert conductor.process.poll() is None
    finally:
        watcher.stop()
        watcher.close()
        stage.close()
