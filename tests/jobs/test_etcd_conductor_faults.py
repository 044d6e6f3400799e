"""Conductor processes on an etcd board, killed and frozen (see ``board_stage``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from board_stage import (
    BoardStage,
    test_a_board_outage_longer_than_the_claim_reverts_nothing,
    test_a_conductor_cut_off_from_its_board_mid_step_reverts_nothing,
    test_a_conductor_frozen_past_its_claim_runs_no_further_atom,
    test_kill_9_mid_flow_another_conductor_finishes_without_rerunning,
)
from boards import wipe_etcd
from conductor_procs import conductors
from servers import require_module

require_module("etcd3gw")

# Real server and conductor processes, a claim left to lapse: 10-40 s each on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
# A fixture and the tests every backend passes, imported for pytest.
__all__ = ["conductors", "test_a_conductor_frozen_past_its_claim_runs_no_further_atom",
           "test_kill_9_mid_flow_another_conductor_finishes_without_rerunning",
           "test_a_board_outage_longer_than_the_claim_reverts_nothing",
           "test_a_conductor_cut_off_from_its_board_mid_step_reverts_nothing"]

CLAIM_TTL = 2.0


@pytest.fixture
def stage(etcd_endpoint: tuple[str, int], tmp_path: Path) -> Iterator[BoardStage]:
    host, port = etcd_endpoint
    namespace = f"fe-faults-{uuid.uuid4().hex[:10]}"
    made = BoardStage(f"etcd://{host}:{port}/{namespace}", {"claim_ttl": CLAIM_TTL}, tmp_path,
                      lambda: wipe_etcd(etcd_endpoint, namespace))
    yield made
    made.close()
