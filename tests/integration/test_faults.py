"""Workers that die, freeze, poison their queue, stop, or never exist: no flow hangs or lies.

Real ``flowengine worker`` processes on Redis and on RabbitMQ, started and signalled by pid. What
ran is counted from the tasks' own ledger (:mod:`fault_tasks`), never from the engine. Leases
are short (``lease_timeout`` 2 s, heartbeats every 0.5 s) and every wait is a poll with a deadline.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import time
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Keeper, Stage, by_pid, flowengine_cli, logs, wait_until
from wbe_harness import Broker, ProtocolClient, WorkerFleet, request_body, require_broker

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import protocol as pr

# Slowest test here: 32 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "faults"
TASKS = [ft.__name__]
#: Short leases: a silent worker's request runs again elsewhere within a few seconds.
LEASE = {"lease_timeout": 2.0, "heartbeat_interval": 0.5}
#: Upper bound of a lease lapse's detection: the lease plus housekeeping and dispatch slack.
LAPSE_BOUND = 2.0 + 3.0
#: AMQP heartbeat (seconds) where a test needs RabbitMQ to notice a frozen consumer soon.
HEARTBEAT = 2



@pytest.fixture
def engine_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="flowengine.worker_based")
    return caplog


def _logged(caplog: pytest.LogCaptureFixture, pattern: str) -> list[str]:
    return [m for m in (r.getMessage() for r in list(caplog.records)) if re.search(pattern, m)]


def _load(fleet: WorkerFleet, flow: Any, **options: Any) -> Any:
    options = {"transition_timeout": WAIT, **LEASE, **options}
    return engines.load(flow, engine="worker-based", **fleet.engine_options(TOPIC, **options))


def _once_each(stage: Stage, atoms: list[str]) -> None:
    for atom in atoms:
        stage.ledger.assert_ran_once(atom)


# ---- 1. kill -9 ----------------------------------------------------------------------------------


def test_kill_9_of_the_busy_worker_runs_the_task_again_elsewhere(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    workers = fleet.start(TOPIC, TASKS, count=2, threads=1)
    flow = lf.Flow("killed").add(
        ft.Step("first"),
        ft.Gate("victim", provides="held"),
        ft.Use("after", rebind={"value": "held"}),
        ft.Step("last"),
    )
    run = runs.start(_load(fleet, flow))
    [start] = stage.ledger.wait_for("victim", ft.EXECUTE_START)
    victim = by_pid(workers, start["pid"])
    killed_at = time.time()
    victim.signal(signal.SIGKILL)

    [_, again] = stage.ledger.wait_for("victim", ft.EXECUTE_START, count=2, timeout=LAPSE_BOUND * 2)
    recovery = again["t"] - killed_at
    print(f"\n[{broker}] kill -9 -> task restarted on pid {again['pid']} in {recovery:.3f}s")
    assert again["pid"] != victim.pid and by_pid(workers, again["pid"]).alive, stage.ledger.dump()
    assert recovery < LAPSE_BOUND, recovery
    stage.gates.open("victim")

    assert run.join(WAIT) is None, logs(workers)
    assert victim.wait_exit(0) == -signal.SIGKILL
    assert run.engine.storage.get_flow_state() == states.SUCCESS
    held = run.engine.storage.fetch("held")
    assert held == {"atom": "victim", "pid": again["pid"]}
    [used] = stage.ledger.ends("after")
    assert used["value"] == held
    _once_each(stage, ["first", "after", "last"])
    assert [e["pid"] for e in stage.ledger.ends("victim")] == [again["pid"]]


# ---- 2. SIGSTOP ----------------------------------------------------------------------------------


def test_a_frozen_worker_loses_its_task_and_its_late_result_is_ignored(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    engine_logs: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    workers = fleet.start(TOPIC, TASKS, count=2, threads=1)
    flow = lf.Flow("frozen").add(
        ft.Gate("held", provides="result"),
        ft.Use("after", rebind={"value": "result"}),
    )
    run = runs.start(_load(fleet, flow))
    [first] = stage.ledger.wait_for("held", ft.EXECUTE_START)
    frozen = by_pid(workers, first["pid"])
    frozen.signal(signal.SIGSTOP)
    try:
        stopped_at = time.time()
        [_, second] = stage.ledger.wait_for("held", ft.EXECUTE_START, count=2,
                                            timeout=LAPSE_BOUND * 2)
        print(f"\n[{broker}] SIGSTOP -> task restarted on pid {second['pid']} in "
              f"{second['t'] - stopped_at:.3f}s")
        assert second["pid"] != frozen.pid, stage.ledger.dump()
        # On beanstalkd the request's time-to-run is the lease: its job may come back to the
        # other worker (redelivered) just before the engine's own lease lapses.
        why = "its lease lapsed" + ("|the broker redelivered it" if broker.name == "beanstalk"
                                    else "")
        assert _logged(engine_logs, rf"Attempt 1 of task 'held' .* is lost: ({why})")
    finally:
        frozen.signal(signal.SIGCONT)
    # The woken worker finishes first; its reply to the lapsed attempt must change nothing.
    stage.gates.open("held", pid=frozen.pid)
    stage.ledger.wait_for("held", ft.EXECUTE_END, where=lambda e: e["pid"] == frozen.pid)
    wait_until(lambda: _logged(engine_logs, r"Ignoring SUCCESS reply for unknown or finished"),
               WAIT, "the engine ignoring the late SUCCESS", details=lambda: logs(workers))
    assert not run.done and stage.ledger.starts("after") == []
    stage.gates.open("held", pid=second["pid"])

    assert run.join(WAIT) is None, logs(workers)
    assert run.engine.storage.get_flow_state() == states.SUCCESS
    assert run.engine.storage.fetch("result") == {"atom": "held", "pid": second["pid"]}
    assert [e["pid"] for e in stage.ledger.ends("held")] == [frozen.pid, second["pid"]]
    [used] = stage.ledger.ends("after")
    assert used["value"] == {"atom": "held", "pid": second["pid"]}
    _once_each(stage, ["after"])
    assert frozen.alive


@pytest.mark.parametrize("broker_name", ["redis", "rabbitmq", "beanstalk"])
def test_a_frozen_worker_with_a_free_slot_does_not_swallow_the_new_attempt(
    broker_name: str, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    engine_logs: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    broker = require_broker(broker_name)
    # A short AMQP heartbeat: RabbitMQ keeps feeding a frozen consumer's free prefetch slots
    # until it closes the silent connection (and redelivers what it held, which the other
    # worker hands back to the engine to send again).
    url = f"{broker.url}?heartbeat={HEARTBEAT}" if broker.name == "rabbitmq" else None
    fleet = fleet_factory(broker, exchange, env=stage.env, url=url)
    client = ProtocolClient(broker.url, exchange)
    try:
        # The other worker is busy (one thread) when the lease lapses, and free soon after.
        [other] = fleet.start(TOPIC, TASKS, threads=1)
        client.publish(TOPIC, request_body(f"{ft.__name__}.Gate", "blocker"))
        stage.ledger.wait_for("blocker", ft.EXECUTE_START)
        [frozen] = fleet.start(TOPIC, TASKS, threads=2)
        flow = lf.Flow("frozen").add(ft.Gate("held", provides="result"),
                                     ft.Use("after", rebind={"value": "result"}))
        run = runs.start(_load(fleet, flow, transition_timeout=10.0))
        stage.ledger.wait_for("held", ft.EXECUTE_START, where=lambda e: e["pid"] == frozen.pid)
        frozen.signal(signal.SIGSTOP)
        wait_until(lambda: _logged(engine_logs, r"Attempt 1 of task 'held' .* lease lapsed"),
                   LAPSE_BOUND * 2, "the lease lapsing")
        stage.gates.open("blocker")
        stage.ledger.wait_for("blocker", ft.EXECUTE_END)
        # Free now, the other worker must get the new attempt (on RabbitMQ once the broker
        # has given up on the frozen consumer: two heartbeats).
        stage.ledger.wait_for("held", ft.EXECUTE_START, timeout=LAPSE_BOUND + 2 * HEARTBEAT,
                              where=lambda e: e["pid"] == other.pid)
        stage.gates.open("held", pid=other.pid)
        assert run.join(WAIT) is None
        assert run.engine.storage.fetch("result") == {"atom": "held", "pid": other.pid}
    finally:
        frozen.signal(signal.SIGCONT)
        stage.gates.open("held")
        client.close()


# ---- 3. a task that kills every worker it runs on ------------------------------------------------

MAX_ATTEMPTS = 3
#: Short, so requests the broker still holds after their flow gave up are void soon.
POISON_TIMEOUT = 5.0
#: A bystander's request can be taken by each worker the poison kills before it starts, and
#: waits for every lapse and hand-back in turn (CI once saw one expire after 5 s on Redis).
BYSTANDER_TIMEOUT = POISON_TIMEOUT + MAX_ATTEMPTS * LAPSE_BOUND


def _dead_letters(broker: Broker, exchange: str) -> list[dict[str, Any]]:
    listed = flowengine_cli("dead-letters", "list", "--json", "--url", broker.url,
                            "--exchange", exchange)
    assert listed.returncode == 0, listed.stderr
    return [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]


def test_a_lost_request_is_parked_listed_and_requeued(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    """Dead letters on every broker, by a frozen worker (no kill, so no broker redelivery)."""
    fleet = fleet_factory(broker, exchange, env=stage.env)
    workers = fleet.start(TOPIC, TASKS, count=2, threads=1)
    flow = lf.Flow("parked").add(ft.Step("before"), ft.Gate("held"))
    run = runs.start(_load(fleet, flow, max_attempts=1))
    [start] = stage.ledger.wait_for("held", ft.EXECUTE_START)
    frozen = by_pid(workers, start["pid"])
    [other] = [w for w in workers if w is not frozen]
    frozen.signal(signal.SIGSTOP)
    try:
        error = run.join(WAIT)
        assert isinstance(error, exc.WorkerLost), error
        assert run.engine.storage.get_flow_state() == states.REVERTED
        [letter] = _dead_letters(broker, exchange)
        assert (letter["task_name"], letter["action"], letter["topic"]) == \
            ("held", "execute", TOPIC)
        assert "lost its worker on each of 1 attempt" in letter["reason"], letter
        assert letter["workers"] and letter["workers"][0].split(":")[1] == str(frozen.pid)
        # Its flow has reverted, which nothing here can read: refused unless forced.
        refused = flowengine_cli("dead-letters", "requeue", letter["id"], "--url", broker.url,
                                 "--exchange", exchange)
        assert refused.returncode == 1 and "--force" in refused.stderr, refused.stderr
        assert [d["id"] for d in _dead_letters(broker, exchange)] == [letter["id"]]
        requeued = flowengine_cli("dead-letters", "requeue", letter["id"], "--url", broker.url,
                                  "--exchange", exchange, "--force")
        assert requeued.returncode == 0, requeued.stderr
        stage.ledger.wait_for("held", ft.EXECUTE_START, where=lambda e: e["pid"] == other.pid)
        assert _dead_letters(broker, exchange) == []
        missing = flowengine_cli("dead-letters", "requeue", letter["id"], "--url", broker.url,
                                 "--exchange", exchange)
        assert missing.returncode == 2, (missing.stdout, missing.stderr)
    finally:
        frozen.signal(signal.SIGCONT)
        stage.gates.open("held")


@pytest.mark.parametrize("broker_name", ["redis", "rabbitmq", "beanstalk"])
def test_a_task_that_kills_its_workers_fails_after_max_attempts_and_is_parked(
    broker_name: str, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    broker = require_broker(broker_name)
    # Transition timeouts this short need Redis to hand out again, as soon, what a killed
    # worker had taken and not started (kombu's default waits an hour, flowengine's 30 s).
    redis = {"visibility_timeout": 1, "unacked_restore_throttle": 1}
    transport_options = redis if broker_name == "redis" else {}
    fleet = fleet_factory(broker, exchange, env=stage.env, worker_args=[
        arg for key, value in transport_options.items()
        for arg in ("--transport-option", f"{key}={value}")])
    fleet.start(TOPIC, TASKS, count=2, threads=2)
    options = {"max_attempts": MAX_ATTEMPTS, "transition_timeout": POISON_TIMEOUT,
               "transport_options": transport_options}
    poisoned = _load(fleet, lf.Flow("poisoned").add(ft.Step("before"),
                                                    ft.KillsItsWorker("poison")), **options)
    bystanders = [
        _load(fleet, lf.Flow(f"bystander-{i}").add(
            *(ft.Slow(f"slow-{i}-{j}", inject={"seconds": 0.2}) for j in range(4))),
            # A bystander running beside the poison dies with its worker, at worst on each of
            # the poison's attempts (on a shared tube, as on beanstalkd, any worker takes it).
            **{**options, "transition_timeout": BYSTANDER_TIMEOUT,
               "max_attempts": MAX_ATTEMPTS + 1})
        for i in range(2)]
    with Keeper(fleet, TOPIC, TASKS, threads=2, count=2) as keeper:
        started = [runs.start(engine, name) for engine, name in
                   zip([poisoned, *bystanders], ["poisoned", "bystander-0", "bystander-1"])]

        def details() -> str:
            return f"deaths: {keeper.deaths}\n{stage.ledger.dump()}"

        error = started[0].join(WAIT * 2, details)
        others = [run.join(WAIT * 2, details) for run in started[1:]]
    executions = len(stage.ledger.starts("poison"))
    print(f"\n[{broker}] poison: {executions} executions, {len(keeper.deaths)} worker deaths, "
          f"flow ended after {started[0].elapsed:.1f}s with {error!r}; bystanders: {others}")

    # Exactly max_attempts executions, then WorkerLost, and the flow reverted.
    assert executions == MAX_ATTEMPTS, details()
    assert isinstance(error, exc.WorkerLost), error
    assert re.search(rf"lost its worker on each of {MAX_ATTEMPTS} attempt", str(error)), error
    assert poisoned.storage.get_flow_state() == states.REVERTED
    assert len(stage.ledger.reverts("before")) == 1, stage.ledger.dump()
    # The flows sharing those workers finished, every step of them.
    assert others == [None, None], others
    for i, engine in enumerate(bystanders):
        assert engine.storage.get_flow_state() == states.SUCCESS
        for j in range(4):
            assert stage.ledger.ends(f"slow-{i}-{j}"), stage.ledger.dump()

    # The operator sees the request parked, with the reason, and can send it back.
    [letter] = _dead_letters(broker, exchange)
    assert (letter["task_name"], letter["action"], letter["topic"]) == ("poison", "execute", TOPIC)
    assert re.search(rf"lost its worker on each of {MAX_ATTEMPTS} attempt", letter["reason"])
    assert len(letter["workers"]) == MAX_ATTEMPTS, letter
    stage.cured.touch()  # the cause is fixed
    requeued = flowengine_cli("dead-letters", "requeue", letter["id"], "--url", broker.url,
                              "--exchange", exchange, "--force")
    assert requeued.returncode == 0, requeued.stderr
    assert letter["id"] in requeued.stdout
    stage.ledger.wait_for("poison", ft.EXECUTE_END)
    assert _dead_letters(broker, exchange) == []
    assert executions == MAX_ATTEMPTS and len(stage.ledger.starts("poison")) == MAX_ATTEMPTS + 1


# ---- 5. SIGTERM ---------------------------------------------------------------------------------

#: The harness starts workers with ``--grace 5``.
GRACE = 5.0


def _offline_announced(watcher: ProtocolClient, pid: int) -> None:
    watcher.wait_for(
        lambda m: m.type == pr.NOTIFY
        and m.headers.get(pr.HEADER_WORKER_STATUS) == pr.WORKER_OFFLINE
        and str(m.headers.get(pr.HEADER_ORIGIN, "")).endswith(f":{pid}"),
        WAIT, f"the offline announcement of worker pid {pid}")


def _engine_heard_offline(caplog: pytest.LogCaptureFixture, pid: int) -> None:
    wait_until(lambda: _logged(caplog, rf"Worker [^ ]*:{pid}:[^ ]* .* went offline"),
               WAIT, f"the engine hearing that worker pid {pid} went offline")


def test_sigterm_lets_in_flight_work_finish_and_the_worker_exits_offline(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [stopping] = fleet.start(TOPIC, TASKS, threads=2)
    run = runs.start(_load(fleet, uf.Flow("terminated").add(ft.Gate("one"), ft.Gate("two"))))
    for atom in ("one", "two"):
        stage.ledger.wait_for(atom, ft.EXECUTE_START)
    watcher = ProtocolClient(broker.url, exchange, bind=[pr.DISCOVERY_ROUTING_KEY])
    try:
        stopping.signal(signal.SIGTERM)
        wait_until(lambda: "received SIGTERM" in stopping.log(), WAIT, "the worker stopping")
        # Both tasks are in flight, and finish within the grace.
        stage.gates.open("one")
        stage.gates.open("two")
        assert stopping.wait_exit(GRACE + 5.0) == 0, stopping.failure("did not exit 0")
        _offline_announced(watcher, stopping.pid)
    finally:
        watcher.close()
    assert run.join(WAIT) is None, logs(fleet.workers)
    assert run.engine.storage.get_flow_state() == states.SUCCESS
    _once_each(stage, ["one", "two"])


def test_sigterm_hands_back_work_that_outlasts_the_grace_to_another_worker(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    engine_logs: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [stopping] = fleet.start(TOPIC, TASKS, threads=2)
    flow = lf.Flow("terminated").add(ft.Gate("long", provides="held"),
                                     ft.Use("after", rebind={"value": "held"}))
    run = runs.start(_load(fleet, flow))
    stage.ledger.wait_for("long", ft.EXECUTE_START)
    [taking_over] = fleet.start(TOPIC, TASKS, threads=2)
    watcher = ProtocolClient(broker.url, exchange, bind=[pr.DISCOVERY_ROUTING_KEY])
    try:
        stopping.signal(signal.SIGTERM)
        # Not done within the grace: handed back unacknowledged, it runs on the other worker.
        stage.ledger.wait_for("long", ft.EXECUTE_START, timeout=GRACE + WAIT,
                              where=lambda e: e["pid"] == taking_over.pid)
        _offline_announced(watcher, stopping.pid)
        _engine_heard_offline(engine_logs, stopping.pid)
        stage.gates.open("long", pid=taking_over.pid)
        assert run.join(WAIT) is None, logs(fleet.workers)
    finally:
        watcher.close()
        stage.gates.open("long")  # lets the stopped worker go (see the next test)
    assert "received SIGTERM" in stopping.log(), stopping.log()
    assert run.engine.storage.get_flow_state() == states.SUCCESS
    assert run.engine.storage.fetch("held") == {"atom": "long", "pid": taking_over.pid}
    _once_each(stage, ["after"])
    assert {e["pid"] for e in stage.ledger.ends("after")} == {taking_over.pid}


def test_sigterm_exits_within_the_grace_when_a_task_outlasts_it(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [stopping] = fleet.start(TOPIC, TASKS, threads=2)
    client = ProtocolClient(broker.url, exchange)
    try:
        client.publish(TOPIC, request_body(f"{ft.__name__}.Gate", "long"))
        stage.ledger.wait_for("long", ft.EXECUTE_START)
        stopping.signal(signal.SIGTERM)
        code = stopping.wait_exit(GRACE + 3.0)
        assert code == 0, stopping.failure(f"still running {GRACE + 3.0}s after SIGTERM")
    finally:
        stage.gates.open("long")
        client.close()


def test_a_worker_going_offline_does_not_rerun_work_another_worker_holds(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    engine_logs: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [stopping] = fleet.start(TOPIC, TASKS, threads=1)
    # Both requests are dispatched to the only worker known; it takes one, and the other waits
    # in the topic's queue until the worker started next takes it.
    run = runs.start(_load(fleet, uf.Flow("pair").add(ft.Gate("a"), ft.Gate("b"))))
    first = wait_until(stage.ledger.lines, WAIT, "a task starting")[0]
    held, moved = first["atom"], {"a": "b", "b": "a"}[first["atom"]]
    [other] = fleet.start(TOPIC, TASKS, threads=1)
    [second] = stage.ledger.wait_for(moved, ft.EXECUTE_START)
    assert (first["pid"], second["pid"]) == (stopping.pid, other.pid)
    stopping.signal(signal.SIGTERM)
    wait_until(lambda: "received SIGTERM" in stopping.log(), WAIT, "the worker stopping")
    stage.gates.open(held)  # in flight, done within the grace
    assert stopping.wait_exit(GRACE + 5.0) == 0, stopping.failure("did not exit 0")
    _engine_heard_offline(engine_logs, stopping.pid)
    stage.gates.open(moved)
    assert run.join(WAIT) is None
    assert run.engine.storage.get_flow_state() == states.SUCCESS
    assert _logged(engine_logs, rf"Attempt 1 of task '{moved}' .* is lost") == []
    _once_each(stage, ["a", "b"])


# ---- 6. no worker for a topic --------------------------------------------------------------------

NO_WORKER_TIMEOUT = 2.0


def _run_without_a_worker(broker: Broker, exchange: str, fleet_factory: Any, stage: Stage,
                          runs: EngineRuns) -> tuple[Any, Any]:
    fleet = fleet_factory(broker, exchange, env=stage.env)
    fleet.start(TOPIC, [f"{ft.__name__}:Step"], threads=1)  # nobody runs Slow
    flow = lf.Flow("orphaned").add(ft.Step("before"), ft.Slow("orphan"))
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPIC, topics=[TOPIC, "nobody-listens"], transition_timeout=NO_WORKER_TIMEOUT, **LEASE))
    run = runs.start(engine)
    return run, run.join(WAIT)


def test_a_request_no_worker_takes_fails_after_the_transition_timeout(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    run, error = _run_without_a_worker(broker, exchange, fleet_factory, stage, runs)
    print(f"\n[{broker}] no worker: flow failed after {run.elapsed:.2f}s")
    assert isinstance(error, exc.RequestTimeout), error
    assert "'orphan'" in str(error) and f"{NO_WORKER_TIMEOUT} seconds" in str(error), error
    # Bounded by the timeout it was given (the default is 60 s): the execute request's, at
    # most one more for its revert request, and room for a loaded machine.
    assert NO_WORKER_TIMEOUT <= run.elapsed < 2 * NO_WORKER_TIMEOUT + 10.0, run.elapsed
    _once_each(stage, ["before"])
    assert stage.ledger.events("orphan") == []


def test_a_request_no_worker_takes_reverts_the_flow(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    run, error = _run_without_a_worker(broker, exchange, fleet_factory, stage, runs)
    assert isinstance(error, exc.RequestTimeout), error
    assert len(stage.ledger.reverts("before")) == 1, stage.ledger.dump()
    assert run.engine.storage.get_flow_state() == states.REVERTED
