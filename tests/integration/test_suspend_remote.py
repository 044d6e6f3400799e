"""Suspending an engine with remote work queued, on real brokers and worker processes.

One worker with one thread: the first gated task runs, the other two wait in the topic's queue
(or the worker's prefetch). After ``engine.suspend()`` the waiting two must never start (the
tasks' own ledger says so), the running one must finish, and a resumed run must do the rest,
each task exactly once.
"""

from __future__ import annotations

from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Stage, logs, wait_until
from wbe_harness import Broker

from flowengine import engines, states
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import protocol as pr

pytestmark = pytest.mark.integration

TOPIC = "suspended"
ATOMS = ["a", "b", "c"]


def test_suspending_drops_queued_requests_and_a_resumed_run_does_them_once(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [worker] = fleet.start(TOPIC, [ft.__name__], threads=1)
    flow = uf.Flow("suspended").add(*(ft.Gate(name) for name in ATOMS))
    engine = engines.load(flow, engine="worker-based",
                          **fleet.engine_options(TOPIC, transition_timeout=WAIT))
    run = runs.start(engine)
    wait_until(lambda: [e for a in ATOMS for e in stage.ledger.starts(a)], WAIT,
               "one task starting", details=lambda: logs([worker]))
    # Suspend once all three have gone out and the engine waits for them. A request still
    # WAITING for its worker to be known (the engine may learn of the worker while sending, one
    # request after another) would be dropped in the engine, unsent, with no CANCEL for the
    # worker to hear; and a suspension that lands while a batch is still going out lets that
    # batch run (only a waiting engine cancels what has not started).
    wait_until(lambda: _waits_for_all_sent(engine), WAIT, "all three requests sent",
               details=lambda: logs([worker]))
    engine.suspend()
    # The worker logs each CANCEL it hears; the queued two are revoked once it has both.
    wait_until(lambda: worker.log(tail=200).count("revoked request") >= 2, WAIT,
               "the worker hearing the CANCELs", details=lambda: logs([worker]))
    for name in ATOMS:
        stage.gates.open(name)
    assert run.join(WAIT, details=lambda: logs([worker])) is None
    assert engine.storage.get_flow_state() == states.SUSPENDED
    started = [a for a in ATOMS if stage.ledger.starts(a)]
    assert len(started) == 1, stage.ledger.dump()

    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    for name in ATOMS:
        assert len(stage.ledger.starts(name)) == 1, (name, stage.ledger.dump())


def _waits_for_all_sent(engine: Any) -> bool:
    """Whether the engine's run loop waits, with every attempt in flight gone to a worker
    (the engine's own bookkeeping: nothing outside its process tells a sent request from one
    it holds)."""
    executor, loop = engine._worker_executor, engine._loop
    with executor._lock:
        requests = [sub.request for sub in executor._ongoing.values()]
    sent = sum(1 for request in requests
               if request is not None and request.current_state != pr.WAITING)
    return sent == len(ATOMS) and loop is not None and loop._blocked
