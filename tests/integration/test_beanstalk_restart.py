"""beanstalkd restarted without a binlog mid-flow: the outcome published after it is not lost.

Such a restart forgets every job and every binding (they are jobs too), the engine's reply
queue binding included. A worker whose task finishes across the restart publishes the outcome
once it reconnects, perhaps before the engine's consumer has bound its reply queue again; the
outcome must still reach the engine, so the task is not run again when its lease lapses. A
private beanstalkd of the test's own is restarted, never the shared one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, PrivateBeanstalkd, Stage, logs, wait_until

from flowengine import engines, states
from flowengine.flows import linear_flow as lf

pytestmark = pytest.mark.integration

TOPIC = "restarted"


@pytest.fixture
def beanstalkd(tmp_path: Path) -> Iterator[PrivateBeanstalkd]:
    with PrivateBeanstalkd(tmp_path / "beanstalkd", binlog=False) as server:
        yield server


def test_an_outcome_published_after_an_empty_restart_reaches_the_engine(
    beanstalkd: PrivateBeanstalkd, exchange: str, fleet_factory: Any, stage: Stage,
    runs: EngineRuns,
) -> None:  # fmt: skip
    fleet = fleet_factory(beanstalkd.broker, exchange, env=stage.env)
    workers = fleet.start(TOPIC, [ft.__name__], threads=1)
    flow = lf.Flow("restart").add(ft.Gate("across"), ft.Step("after"))
    # The engine reconnects 3 s after it lost the server, the worker at once: the outcome
    # reaches the new server before the engine has bound its reply queue there again.
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPIC, transition_timeout=WAIT, heartbeat_interval=0.5, lease_timeout=5.0,
        retry_options={"interval_start": 3.0, "interval_max": 3.0, "jitter": 0.0}))
    run = runs.start(engine)
    stage.ledger.wait_for("across", ft.EXECUTE_START)

    beanstalkd.stop()
    beanstalkd.start()  # empty: no jobs, no bindings
    wait_until(beanstalkd.ready, WAIT, "beanstalkd back")
    stage.gates.open("across")  # its outcome goes out on the new server

    assert run.join(WAIT, lambda: logs(workers)) is None, logs(workers)
    assert engine.storage.get_flow_state() == states.SUCCESS
    # Had the outcome been dropped, the lapsed lease would have run the task a second time.
    assert len(stage.ledger.starts("across")) == 1, stage.ledger.dump()
    assert len(stage.ledger.starts("after")) == 1, stage.ledger.dump()
