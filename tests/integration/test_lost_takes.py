"""A request the broker lost after a worker took it is sent again, not waited out.

kombu's Redis transport takes a message off its queue (BRPOP) and only then records it as
delivered and unsettled (a second command). A worker killed between the two loses the request:
it is in no queue, in no worker, and no lease covers it, since the attempt never said it runs.
The engine's broker client looks every few seconds for the requests it sent a while ago that no
worker said it runs, and one the broker no longer holds, twice in a row, is lost: it is sent
again as a lost worker's attempt would be.

The killed worker is played by the test: it takes the request off the Redis list itself, as the
worker's BRPOP would have, while the only worker is busy.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import fault_tasks as ft
import pytest
import redis
from fault_support import WAIT, EngineRuns, Stage, wait_until
from wbe_harness import Broker, ProtocolClient, WorkerFleet, request_body

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.engines.actions import META_ATTEMPT_IDS
from flowengine.flows import linear_flow as lf
from flowengine.worker_based import client as bc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "takes"
TASKS = [ft.__name__]
#: The looks it takes to judge a request lost, with room for a loaded machine.
JUDGED_WITHIN = (bc.HELD_MISSES + 1) * bc.HELD_CHECK_PERIOD + 10.0


def _take_off_the_queue(url: str, queue: str, request_id: str) -> bool:
    """Remove the message of ``request_id`` from ``queue``'s lists, as a worker's BRPOP would;
    whether it was there."""
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{queue}*"):
            if client.type(key) != b"list":
                continue
            for entry in client.lrange(key, 0, -1):
                if request_id.encode() in entry:
                    return bool(client.lrem(key, 1, entry))
        return False
    finally:
        client.close()


def _attempt_ids(engine: Any, atom: str) -> list[str]:
    """The ids of the attempts sent for ``atom``, as its engine stored them (none before the
    engine stored the atom)."""
    try:
        detail = engine.storage.flow_detail.find(engine.storage.get_atom_uuid(atom))
    except exc.NotFound:
        return []
    return list(detail.meta.get(META_ATTEMPT_IDS) or []) if detail is not None else []


def _busy_worker_and_engine(broker: Broker, exchange: str, fleet_factory: Any, stage: Stage,
                            runs: EngineRuns, atom: str) -> tuple[Any, Any, Any]:
    """A one-thread worker busy with a bare client's gated request ``blocker`` (it takes
    nothing more until the gate opens), and an engine running a one-task flow (``atom``) to
    its topic: its request waits in the queue. Returns the worker, the engine and its run."""
    fleet: WorkerFleet = fleet_factory(broker, exchange, env=stage.env)
    [worker] = fleet.start(TOPIC, TASKS, threads=1)
    client = ProtocolClient(broker.url, exchange)
    try:
        client.publish(TOPIC, request_body(f"{ft.__name__}.Gate", "blocker"))
        stage.ledger.wait_for("blocker", ft.EXECUTE_START)
    finally:
        client.close()
    # The transition timeout is far beyond the looks: the flow must never wait it out.
    engine = engines.load(lf.Flow(atom).add(ft.Step(atom)), engine="worker-based",
                          **fleet.engine_options(TOPIC, transition_timeout=120.0))
    return worker, engine, runs.start(engine)


def test_a_request_a_dead_worker_took_is_sent_again(
    redis_broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="flowengine.worker_based")
    worker, engine, run = _busy_worker_and_engine(redis_broker, exchange, fleet_factory, stage,
                                                  runs, "taken")

    def sent() -> str | None:
        ids = _attempt_ids(engine, "taken")
        return ids[-1] if ids else None

    request_id = wait_until(sent, WAIT, "the request's id stored as it was sent")
    wait_until(lambda: _take_off_the_queue(redis_broker.url, f"{exchange}_{TOPIC}", request_id),
               WAIT, "the request taken off the topic's queue (the dead worker's BRPOP)")
    taken_at = time.monotonic()
    stage.gates.open("blocker")

    assert run.join(JUDGED_WITHIN + WAIT) is None, worker.log()
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert time.monotonic() - taken_at < JUDGED_WITHIN + WAIT
    stage.ledger.assert_ran_once("taken")
    lost = [r.getMessage() for r in caplog.records
            if re.search(r"is lost: the broker no longer holds its request", r.getMessage())]
    assert len(lost) == 1 and request_id in lost[0], lost


def test_a_request_waiting_in_a_busy_queue_is_left_alone(
    redis_broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The looks find a request that merely waits (its only worker busy for longer than two
    looks) and leave it be: it runs once, as the first attempt."""
    caplog.set_level(logging.WARNING, logger="flowengine.worker_based")
    _worker, engine, run = _busy_worker_and_engine(redis_broker, exchange, fleet_factory,
                                                   stage, runs, "waiting")
    wait_until(lambda: _attempt_ids(engine, "waiting"), WAIT, "the request sent")
    broker_client = engine.worker_executor.client
    looked = broker_client.looks
    # Each look after the first HELD_CHECK_PERIOD includes the waiting request: enough of them
    # to have judged it lost, were it missing.
    wait_until(lambda: broker_client.looks >= looked + bc.HELD_MISSES + 1, JUDGED_WITHIN,
               "the broker client's looks at the waiting request")
    stage.gates.open("blocker")
    assert run.join(WAIT) is None
    assert engine.storage.get_flow_state() == states.SUCCESS
    stage.ledger.assert_ran_once("waiting")
    assert not [r for r in caplog.records if "is lost" in r.getMessage()]
    assert len(_attempt_ids(engine, "waiting")) == 1
