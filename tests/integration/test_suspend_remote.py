"""Suspending an engine with remote work queued, on real brokers and worker processes.

One worker with one thread: the first gated task runs, the other two wait in the topic's queue
(or the worker's prefetch). After ``engine.suspend()`` the waiting two must never start (the
tasks' own ledger says so), the running one must finish, and a resumed run must do the rest,
each task exactly once. The same holds for a suspension from another thread that lands while
the engine is still sending the batch.
"""

from __future__ import annotations

import threading
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
    worker, engine = _gated_engine(fleet_factory(broker, exchange, env=stage.env))
    run = runs.start(engine)
    wait_until(lambda: [e for a in ATOMS for e in stage.ledger.starts(a)], WAIT,
               "one task starting", details=lambda: logs([worker]))
    # A request still WAITING for its worker to be known (the engine may learn of the worker
    # while sending, one request after another) would be dropped in the engine, unsent, with
    # no CANCEL for the worker to hear: suspend once all three have gone out.
    wait_until(lambda: _sent(engine) == len(ATOMS), WAIT, "all three requests sent",
               details=lambda: logs([worker]))
    engine.suspend()
    assert _suspended(engine, run, worker, stage) == 1, stage.ledger.dump()
    _resumed_runs_each_once(engine, stage)


def test_a_suspension_from_elsewhere_while_requests_go_out_revokes_them(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    worker, engine = _gated_engine(fleet_factory(broker, exchange, env=stage.env))
    suspended = threading.Event()

    def suspend_from_elsewhere(state: str, details: dict[str, Any]) -> None:
        # On the engine's thread, as the first request of the batch is about to go out: another
        # thread suspends the engine, and the batch goes on once it has. The worker is known
        # first, so the batch is sent rather than left waiting for a worker.
        if not suspended.is_set():
            assert engine.worker_executor.wait_for_workers(1, WAIT) == 0
            helper = threading.Thread(target=engine.suspend)
            helper.start()
            helper.join(WAIT)
            suspended.set()

    engine.atom_notifier.register(states.RUNNING, suspend_from_elsewhere)
    run = runs.start(engine)
    # The worker's one thread takes at most one request, held at its gate.
    assert _suspended(engine, run, worker, stage) <= 1, stage.ledger.dump()
    engine.atom_notifier.deregister(states.RUNNING, suspend_from_elsewhere)
    _resumed_runs_each_once(engine, stage)


def _gated_engine(fleet: Any) -> tuple[Any, Any]:
    """One worker with one thread, and an engine for a flow of three gated tasks."""
    [worker] = fleet.start(TOPIC, [ft.__name__], threads=1)
    flow = uf.Flow("suspended").add(*(ft.Gate(name) for name in ATOMS))
    return worker, engines.load(flow, engine="worker-based",
                                **fleet.engine_options(TOPIC, transition_timeout=WAIT))


def _suspended(engine: Any, run: Any, worker: Any, stage: Stage) -> int:
    """Once the worker has heard the CANCELs, open the gates and check the run ends
    SUSPENDED; return how many tasks started."""
    # The worker logs each CANCEL it hears; the queued two are revoked once it has both.
    wait_until(lambda: worker.log(tail=200).count("revoked request") >= 2, WAIT,
               "the worker hearing the CANCELs", details=lambda: logs([worker]))
    for name in ATOMS:
        stage.gates.open(name)
    assert run.join(WAIT, details=lambda: logs([worker])) is None
    assert engine.storage.get_flow_state() == states.SUSPENDED
    return len([a for a in ATOMS if stage.ledger.starts(a)])


def _resumed_runs_each_once(engine: Any, stage: Stage) -> None:
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    for name in ATOMS:
        assert len(stage.ledger.starts(name)) == 1, (name, stage.ledger.dump())


def _sent(engine: Any) -> int:
    """How many of the engine's attempts in flight have gone to a worker (the engine's own
    bookkeeping: nothing outside its process tells a sent request from one it holds)."""
    return sum(1 for attempt in engine.worker_executor.attempts()
               if attempt.state != pr.WAITING)
