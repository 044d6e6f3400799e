"""A worker known dead is sent nothing: the reverts after it died go to the survivor at once.

Two real worker processes on two topics run the same tasks. Three steps finish, a gated task
holds one worker, and the test SIGKILLs that worker. With ``max_attempts=1`` its lapsed lease
fails the flow, and every revert (the gated task's and the steps', wherever they ran) must run
on the survivor well within ``transition_timeout``: a revert sent to the dead worker's topic
would wait there for the whole timeout and then fail the revert.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Stage, by_pid, logs
from wbe_harness import Broker, WorkerFleet

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import unordered_flow as uf

pytestmark = pytest.mark.integration

TOPICS = ["alive-a", "alive-b"]
TRANSITION_TIMEOUT = 45.0
#: Lease lapse (2 s) plus housekeeping, dispatch and the reverts on a busy machine; a revert
#: sent to the dead worker would take the whole timeout.
RECOVERY_BOUND = 20.0
STEPS = ["s1", "s2", "s3"]


def test_after_a_kill_nothing_goes_to_the_dead_worker(
    redis_broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    fleet: WorkerFleet = fleet_factory(redis_broker, exchange, env=stage.env)
    workers = [w for topic in TOPICS for w in fleet.start(topic, [ft.__name__], threads=4)]
    flow = uf.Flow("liveness").add(*[ft.Step(name) for name in STEPS], ft.Gate("held"))
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPICS[0], topics=TOPICS, transition_timeout=TRANSITION_TIMEOUT, max_attempts=1,
        lease_timeout=2.0, heartbeat_interval=0.5))
    succeeded: set[str] = set()
    stored = threading.Event()

    def on_success(_state: str, details: dict[str, Any]) -> None:
        succeeded.add(details.get("task_name", ""))
        if succeeded.issuperset(STEPS):
            stored.set()

    engine.atom_notifier.register(states.SUCCESS, on_success)
    run = runs.start(engine)
    # The steps' outcomes reached the engine, not only their ledger lines: a kill between a
    # step's end and its outcome's publish loses that step too, and the flow then fails with
    # several WorkerLost at once (a WrappedFailure) instead of the gated task's.
    assert stored.wait(WAIT), (sorted(succeeded), stage.ledger.dump())
    [start] = stage.ledger.wait_for("held", ft.EXECUTE_START)
    victim = by_pid(workers, start["pid"])
    [survivor] = [w for w in workers if w is not victim]
    victim.signal(signal.SIGKILL)

    error = run.join(RECOVERY_BOUND, details=lambda: stage.ledger.dump() + logs(workers))
    assert isinstance(error, exc.WorkerLost), (error, logs(workers))
    for name in [*STEPS, "held"]:
        reverts = stage.ledger.reverts(name)
        assert [r["pid"] for r in reverts] == [survivor.pid], (name, stage.ledger.dump())
