"""A task class no live worker runs fails fast, saying what the workers there do run.

Real ``flowengine worker`` processes on Redis: one serves only ``Constant``, so a flow that
also needs ``Add`` must fail within ``unserved_timeout`` (not the minute-long
``transition_timeout``) with an error naming the class, the topic and what is served there,
and its completed ``Constant`` must be reverted. With no worker on the topic at all, the
ordinary transition timeout applies, and its error says that no worker was known.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from behaviour import tasks
from wbe_harness import Broker, WorkerFleet

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf

pytestmark = pytest.mark.integration

TOPIC = "partial"
#: Far longer than the fail-fast wait: reaching it would mean the fast path did not work.
TRANSITION_TIMEOUT = 60.0
UNSERVED_TIMEOUT = 1.0


def test_a_class_no_worker_runs_fails_fast_naming_what_is_served(
    redis_broker: Broker, exchange: str, fleet_factory: Any, tmp_path: Path,
) -> None:  # fmt: skip
    ledger = tasks.FileLedger(tmp_path / "ledger.jsonl")
    fleet: WorkerFleet = fleet_factory(redis_broker, exchange,
                                       env={tasks.LEDGER_ENV: str(ledger.path)})
    fleet.start(TOPIC, [f"{tasks.__name__}:Constant"], threads=2)
    flow = lf.Flow("needs-add").add(
        tasks.Constant("one", provides="x", inject={"value": 1}),
        tasks.Add("sum", rebind={"y": "x"}, provides="total"))
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPIC, transition_timeout=TRANSITION_TIMEOUT, unserved_timeout=UNSERVED_TIMEOUT))

    started = time.monotonic()
    with pytest.raises(exc.NotFound) as raised:
        engine.run()
    took = time.monotonic() - started

    message = str(raised.value)
    assert "'behaviour.tasks.Add'" in message, message
    assert f"topic(s) '{TOPIC}'" in message, message
    assert f"on topic '{TOPIC}' run: behaviour.tasks.Constant" in message, message
    assert took < TRANSITION_TIMEOUT / 2, f"took {took:.1f}s: the fail-fast path did not act"
    # The work that did run was undone, on the worker that runs its class.
    assert [(e["event"], e["atom"]) for e in ledger.entries()] == [
        ("execute", "one"), ("revert", "one")]


def test_with_no_worker_known_the_transition_timeout_applies_and_says_so(
    redis_broker: Broker, exchange: str, fleet_factory: Any,
) -> None:  # fmt: skip
    fleet: WorkerFleet = fleet_factory(redis_broker, exchange)  # no worker started
    flow = lf.Flow("nobody").add(tasks.Constant("one", inject={"value": 1}))
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        "empty", transition_timeout=2.0, unserved_timeout=UNSERVED_TIMEOUT))

    with pytest.raises(exc.RequestTimeout, match="no worker was known on topic.s. 'empty'"):
        engine.run()
