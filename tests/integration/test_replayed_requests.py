"""A signed request captured off the wire and pushed back runs once, also after a restart.

Real ``flowengine worker`` processes on Redis, RabbitMQ and beanstalkd share a signing key with
the engine; the tasks write a ledger the engine never touches. A request waiting in the topic's
queue is taken out and published again byte for byte, twice: the worker runs it once and
refuses the copy (``reason=replayed``) unanswered. A worker started afterwards on the same host
and topic refuses the same copy again. A request whose worker is killed mid-task is redelivered
by the broker, handed back to its engine and run by a new attempt, as without a key.
"""

from __future__ import annotations

import json
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Keeper, Stage, take_one, wait_until
from wbe_harness import Broker, ProtocolClient, WorkerFleet, WorkerProcess

from flowengine import engines, states
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import signing as sg

pytestmark = pytest.mark.integration

TOPIC = "signed"
KEY = "replay-test-signing-key-0123456789"


@pytest.fixture
def fleet(broker: Broker, exchange: str, fleet_factory: Any, stage: Stage) -> WorkerFleet:
    made: WorkerFleet = fleet_factory(broker, exchange, env={**stage.env, sg.ENV_KEY: KEY})
    return made


def _replayed_lines(worker: WorkerProcess) -> int:
    return worker.log(tail=10_000).count("reason=replayed")


def test_a_replayed_signed_request_runs_once_even_after_a_restart(
    fleet: WorkerFleet, stage: Stage,
) -> None:  # fmt: skip
    [worker] = fleet.start(TOPIC, [ft.__name__], threads=1)
    flow = lf.Flow("replayed").add(
        uf.Flow("pair").add(ft.Gate("g1", provides="r1"), ft.Gate("g2", provides="r2")),
        ft.Use("u1", rebind={"value": "r1"}),
        ft.Use("u2", rebind={"value": "r2"}))
    # No topics: discovery by broadcast, so the topic queue holds requests only.
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPIC, topics=[], transition_timeout=WAIT, signing_key=KEY))
    runs = EngineRuns()
    client = ProtocolClient(fleet.broker.url, fleet.exchange)
    try:
        run = runs.start(engine)
        first = wait_until(lambda: stage.ledger.lines(), WAIT, "a gate starting")[0]["atom"]
        # The other request waits behind it (one task thread): capture it, push it back twice.
        taken = take_one(fleet.broker.url, f"{fleet.exchange}_{TOPIC}")
        other = json.loads(taken.body)["task_name"]
        assert {first, other} == {"g1", "g2"}
        assert sg.HEADER_SIGNATURE in taken.headers
        for _ in range(2):
            client.publish(TOPIC, taken.body, reply_to=taken.properties["reply_to"],
                           correlation_id=taken.properties["correlation_id"],
                           headers=taken.headers)
        stage.gates.open(first)
        stage.gates.open(other)
        assert run.join(WAIT) is None
        assert engine.storage.get_flow_state() == states.SUCCESS
        wait_until(lambda: _replayed_lines(worker) == 1, WAIT, "the copy refused",
                   details=lambda: worker.log())
        assert len(stage.ledger.starts(other)) == 1, stage.ledger.dump()

        # A new worker process on the same host and topic remembers what the old one ran.
        worker.stop()
        [restarted] = fleet.start(TOPIC, [ft.__name__], threads=1)
        client.publish(TOPIC, taken.body, reply_to=taken.properties["reply_to"],
                       correlation_id=taken.properties["correlation_id"], headers=taken.headers)
        wait_until(lambda: _replayed_lines(restarted) == 1, WAIT, "the copy refused again",
                   details=lambda: restarted.log())
        assert len(stage.ledger.starts(other)) == 1, stage.ledger.dump()
        assert not client.replies_to(taken.properties["correlation_id"]), "a copy was answered"
    finally:
        client.close()
        runs.close()


def test_with_a_key_a_request_whose_worker_died_is_run_again(
    fleet: WorkerFleet, stage: Stage,
) -> None:  # fmt: skip
    """The broker redelivers it to the restarted worker, which hands it back; the engine sends
    a new attempt, which runs (the first run's claim does not stand in its way)."""
    flow = lf.Flow("redelivered").add(ft.KillsItsWorker("dies"), ft.Step("after"))
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPIC, transition_timeout=WAIT, signing_key=KEY, heartbeat_interval=0.5,
        lease_timeout=3.0, max_attempts=3))
    with Keeper(fleet, TOPIC, [ft.__name__], threads=1, count=1) as keeper:
        runs = EngineRuns()
        try:
            run = runs.start(engine)
            stage.ledger.wait_for("dies", ft.EXECUTE_START)
            wait_until(lambda: keeper.deaths, WAIT, "the worker dying")
            stage.cured.touch()  # the next run of it survives
            assert run.join(WAIT * 2) is None
        finally:
            runs.close()
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert keeper.deaths, "the worker never died"
    assert len(stage.ledger.ends("dies")) == 1, stage.ledger.dump()
    logs = "".join(w.log(tail=10_000) for w in fleet.workers)
    assert "reason=replayed" not in logs, logs
