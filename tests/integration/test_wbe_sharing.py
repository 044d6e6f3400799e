"""Engines share one pool of worker processes: without cross-talk, and without leftovers.

Six engines, each on its own thread with its own reply queue, run at the same time on two
workers with fewer task threads than there are requests in flight. Every atom's name and input
carry its engine's number, so the ledger shows who ran what. Cross-talk would show as a wrong
result, an atom run twice or never, or a reply an engine does not recognise (which the executor
logs as ignored).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from behaviour import tasks
from wbe_harness import Broker, ProtocolClient, WorkerFleet, queued_messages

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import client as bc

pytestmark = pytest.mark.integration

TOPIC = "shared"
ENGINES = 6
#: Per worker; two workers hold six requests while up to twelve are in flight.
THREADS = 3
#: Seconds every engine gets to finish (a lost or misrouted reply would hang one past it).
RUN_TIMEOUT = 60.0


def flow_for(i: int) -> Any:
    """start-i provides i; two fan-out atoms scale it; sum-i adds them; odd flows then fail."""
    flow = lf.Flow(f"flow-{i}").add(
        tasks.Constant(f"start-{i}", provides="x", inject={"value": i}),
        uf.Flow(f"fan-{i}").add(
            tasks.Scale(f"tens-{i}", provides="a", inject={"factor": 10}),
            tasks.Scale(f"hundreds-{i}", provides="b", inject={"factor": 100})),
        tasks.Add(f"sum-{i}", rebind={"x": "a", "y": "b"}, provides="total"),
    )
    if i % 2:
        flow.add(tasks.Fail(f"boom-{i}"))
    return flow


def test_engines_sharing_workers_get_their_own_results(
    broker: Broker, exchange: str, fleet_factory: Any, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    ledger = tasks.FileLedger(tmp_path / "ledger.jsonl")
    fleet: WorkerFleet = fleet_factory(broker, exchange, env={tasks.LEDGER_ENV: str(ledger.path)})
    workers = fleet.start(TOPIC, [tasks.__name__], count=2, threads=THREADS)
    caplog.set_level(logging.INFO, logger="flowengine.worker_based")

    options = fleet.engine_options(TOPIC, transition_timeout=RUN_TIMEOUT)
    loaded = [engines.load(flow_for(i), engine="worker-based", **options)
              for i in range(ENGINES)]
    outcomes: dict[int, BaseException | None] = {}
    start = threading.Barrier(ENGINES)

    def run(i: int) -> None:
        start.wait()
        try:
            loaded[i].run()
            outcomes[i] = None
        except BaseException as err:  # kept for the assertions below
            outcomes[i] = err

    threads = [threading.Thread(target=run, args=(i,), name=f"engine-{i}")
               for i in range(ENGINES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RUN_TIMEOUT)
    assert not [t.name for t in threads if t.is_alive()], "engines still running"

    lines = ledger.lines()
    executions = 0
    for i, engine in enumerate(loaded):
        mine = [line for line in lines if line["atom"].endswith(f"-{i}")]
        executed = [line["atom"] for line in mine if line["event"] == "execute"]
        # Every atom of this flow ran once, with this flow's inputs.
        expected_atoms = {f"start-{i}", f"tens-{i}", f"hundreds-{i}", f"sum-{i}"}
        if i % 2:
            expected_atoms.add(f"boom-{i}")
        assert sorted(executed) == sorted(expected_atoms), (i, mine)
        executions += len(expected_atoms)
        [summed] = [line for line in mine if line["atom"] == f"sum-{i}"
                    and line["event"] == "execute"]
        assert (summed["x"], summed["y"]) == (10 * i, 100 * i), summed
        if i % 2:
            error = outcomes[i]
            assert isinstance(error, exc.WrappedFailure), error
            assert [f.exception_str for f in error] == [f"boom-{i} failed"]
            reverted = [line["atom"] for line in mine if line["event"] == "revert"]
            assert reverted[:2] == [f"boom-{i}", f"sum-{i}"], reverted
            assert reverted[-1] == f"start-{i}", reverted
            assert engine.storage.get_flow_state() == states.REVERTED
        else:
            assert outcomes[i] is None, outcomes[i]
            assert engine.storage.fetch("total") == 110 * i
            assert engine.storage.get_flow_state() == states.SUCCESS
    assert sum(line["event"] == "execute" for line in lines) == executions

    # Both workers served, and no engine ever saw a reply meant for someone else.
    assert {line["pid"] for line in lines} == {worker.pid for worker in workers}
    logged = [r.getMessage() for r in caplog.records]
    assert sum("Discovered worker" in m for m in logged) >= ENGINES  # the log is being heard
    assert [m for m in logged if "Ignoring" in m] == []


def test_a_finished_engine_leaves_no_queue_that_keeps_filling(
    redis_broker: Broker, exchange: str, fleet_factory: Any,
) -> None:  # fmt: skip
    fleet: WorkerFleet = fleet_factory(redis_broker, exchange)
    fleet.start(TOPIC, [tasks.__name__], threads=1)
    engine = engines.load(tasks.Step("one"), engine="worker-based", **fleet.engine_options(TOPIC))
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    # The engine used the process's client, whose reply queue goes when the client closes
    # (at exit, or after lingering unused).
    [shared] = [c for c in bc.clients() if c.broker.exchange == exchange]
    shared.close()
    # Another worker comes online long after the engine finished. It answers this ping after
    # its announcement is published (one control thread), so the announcement went out.
    fleet.start("late", [tasks.__name__], threads=1)
    client = ProtocolClient(redis_broker.url, exchange)
    try:
        client.ping("late", timeout=15.0)
    finally:
        client.close()
    assert queued_messages(redis_broker.url, f"{exchange}_{shared.uuid}") in (None, 0)
    assert queued_messages(redis_broker.url, f"{exchange}_{engine.storage.flow_uuid}") in (None, 0)
