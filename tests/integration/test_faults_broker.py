"""The broker goes away and comes back; priorities; a backlog of 10,000 requests.

Real ``flowengine worker`` processes on Redis, RabbitMQ and beanstalkd (and flowengine-fs for
priorities). What ran is counted from the tasks' own ledger (:mod:`fault_tasks`). The outage
test stops and restarts the very server the other tests use (only that one), through
:func:`fault_support.broker_outage`, which always leaves it running; on beanstalkd it starts a
private server instead (with a binlog, so its jobs survive the restart).
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import (
    WAIT,
    EngineRuns,
    PrivateBeanstalkd,
    RssSampler,
    Stage,
    broker_outage,
    logs,
    rss_kib,
    wait_until,
)
from wbe_harness import (
    Broker,
    ProtocolClient,
    WorkerFleet,
    queued_messages,
    request_body,
    require_broker,
)

from flowengine import engines, states
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import protocol as pr

# Not measured (it stops the shared servers): broker restarts of several seconds each, so
# a limit well above the default.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "faults"
TASKS = [ft.__name__]



def _load(fleet: WorkerFleet, flow: Any, **options: Any) -> Any:
    return engines.load(flow, engine="worker-based", **fleet.engine_options(TOPIC, **options))


# ---- 4. broker outage ----------------------------------------------------------------------------

#: How long the broker stays down.
OUTAGE = 5.0
#: Reconnect warnings a worker may log for one outage: a few retry sequences (its task queue,
#: its control queue, publishes in flight), each logging its first three attempts and then every
#: tenth; a number that does not grow with the outage.
MAX_RECONNECT_LINES = 20


def _both_workers_consume(stage: Stage, runs: EngineRuns, fleet: WorkerFleet,
                          workers: list[Any], round_: str) -> None:
    """Two gated tasks run at once, one on each single-threaded worker: both consume."""
    names = [f"{round_}-a", f"{round_}-b"]
    run = runs.start(_load(fleet, uf.Flow(round_).add(*(ft.Gate(n) for n in names)),
                           transition_timeout=WAIT))
    for name in names:
        stage.ledger.wait_for(name, ft.EXECUTE_START)
    assert {stage.ledger.starts(n)[0]["pid"] for n in names} == {w.pid for w in workers}
    for name in names:
        stage.gates.open(name)
    assert run.join(WAIT) is None


@pytest.fixture
def restartable(broker: Broker, tmp_path: Path) -> Iterator[Broker]:
    """``broker``, or for beanstalkd a private server of this test's own (never the shared one)."""
    if broker.name != "beanstalk":
        yield broker
        return
    with PrivateBeanstalkd(tmp_path / "beanstalkd") as private:
        yield private.broker


@pytest.mark.exclusive  # stops the Redis and RabbitMQ every other test uses
def test_a_broker_restart_mid_flow_loses_nothing(
    restartable: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    broker = restartable
    fleet = fleet_factory(broker, exchange, env=stage.env)
    workers = fleet.start(TOPIC, TASKS, count=2, threads=1)
    flow = lf.Flow("outage").add(
        ft.Step("first"),
        uf.Flow("during").add(ft.Gate("g1", provides="r1"), ft.Gate("g2", provides="r2")),
        ft.Use("u1", rebind={"value": "r1"}),
        ft.Use("u2", rebind={"value": "r2"}),
        ft.Step("last"),
    )
    # The default lease (10 s) outlasts the outage: what is tested is reconnecting.
    engine = _load(fleet, flow, transition_timeout=WAIT, heartbeat_interval=0.5)
    run = runs.start(engine)
    for gate in ("g1", "g2"):
        stage.ledger.wait_for(gate, ft.EXECUTE_START)
    started = time.monotonic()
    with broker_outage(broker, OUTAGE):
        # Both tasks finish while the broker is away: their outcomes must wait for it.
        for gate in ("g1", "g2"):
            stage.gates.open(gate)
            stage.ledger.wait_for(gate, ft.EXECUTE_END)
    back = time.monotonic()

    assert run.join(WAIT * 2, lambda: logs(workers)) is None, logs(workers)
    print(f"\n[{broker}] outage {back - started:.1f}s; flow finished "
          f"{run.finished - back:.1f}s after the broker came back; executions: "
          + ", ".join(f"{a}={len(stage.ledger.starts(a))}" for a in ("g1", "g2")))
    assert engine.storage.get_flow_state() == states.SUCCESS
    for gate, use in (("g1", "u1"), ("g2", "u2")):
        result = engine.storage.fetch(f"r{gate[1]}")
        assert result["atom"] == gate and result["pid"] in {w.pid for w in workers}
        assert [e["value"] for e in stage.ledger.ends(use)] == [result]
    # Nothing lost. What was running during the outage may have run again (at least once: the
    # broker redelivers what was unacknowledged, and a lease may lapse meanwhile); what ran
    # before or after it ran once.
    for atom in ("g1", "g2"):
        assert stage.ledger.ends(atom), stage.ledger.dump()
    for atom in ("first", "u1", "u2", "last"):
        assert (len(stage.ledger.starts(atom)), len(stage.ledger.ends(atom))) == (1, 1), \
            stage.ledger.dump()

    # No process exited, and every worker consumes again.
    assert all(w.alive for w in workers), logs(workers)
    _both_workers_consume(stage, runs, fleet, workers, "after")
    retries = {w.pid: len(re.findall(r"failed \(attempt \d+\)", w.log(10_000))) for w in workers}
    print(f"[{broker}] reconnect warnings logged per worker: {retries}")
    for worker in workers:
        assert 0 < retries[worker.pid] <= MAX_RECONNECT_LINES, worker.failure("reconnect lines")


# ---- 8. priority (RabbitMQ, beanstalkd, Redis) ----------------------------------------------

#: One per level Redis keeps apart by default (7-9, 4-6, 1-3, 0; see doc/priorities.rst).
PRIORITIES = [0, 2, 5, 8]
#: flowengine-fs in its default data folder (shared by the user's processes; the exchange is
#: the test's own, and so are its queue folders).
FS = Broker("flowengine-fs", "flowengine-fs://localhost")


@pytest.mark.parametrize("broker_name", ["rabbitmq", "beanstalk", "redis", "flowengine-fs"])
def test_queued_requests_are_served_highest_priority_first(
    broker_name: str, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    broker = FS if broker_name == FS.name else require_broker(broker_name)
    fleet = fleet_factory(broker, exchange, env=stage.env)
    fleet.start(TOPIC, TASKS, threads=1)
    client = ProtocolClient(broker.url, exchange)
    try:
        busy = client.publish(TOPIC, request_body(f"{ft.__name__}.Gate", "busy"))
        stage.ledger.wait_for("busy", ft.EXECUTE_START)
        queue = f"{exchange}_{TOPIC}"
        # One engine per priority, each publishing only after the previous request is queued:
        # the broker receives them lowest priority first.
        for count, priority in enumerate(PRIORITIES, start=1):
            step = ft.Step(f"p{priority}")
            step.priority = priority
            # No topics: discovery by broadcast only, so nothing but requests enters the queue.
            runs.start(_load(fleet, step, transition_timeout=WAIT, topics=[]),
                       f"priority-{priority}")
            wait_until(lambda n=count: queued_messages(broker.url, queue) == n, WAIT,
                       f"{count} requests queued behind the busy worker")
        stage.gates.open("busy")
        client.outcome(busy, WAIT)
    finally:
        client.close()
    for run in runs.runs:
        assert run.join(WAIT) is None
        assert run.engine.storage.get_flow_state() == states.SUCCESS
    served = [e["atom"] for e in stage.ledger.lines() if e["event"] == ft.EXECUTE_START
              and e["atom"] != "busy"]
    assert served == [f"p{p}" for p in sorted(PRIORITIES, reverse=True)], stage.ledger.dump()


# ---- 9. a backlog of 10,000 requests -------------------------------------------------------------

BACKLOG = 10_000
#: Seconds the backlog may take to drain (the whole test stays well under 90 s per broker).
DRAIN_TIMEOUT = 75.0
#: Growth of a worker's RSS over its idle size that counts as bounded.
RSS_BOUND_KIB = 150 * 1024


def _noop(n: int) -> dict[str, Any]:
    return request_body(f"{ft.__name__}.Noop", "noop", {"n": n})


def _successes(client: ProtocolClient) -> Counter[str]:
    return Counter(m.correlation_id for m in client.received
                   if m.state == pr.SUCCESS and m.correlation_id is not None)


def test_a_backlog_of_10000_requests_drains_exactly_once_in_bounded_memory(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    workers = fleet.start(TOPIC, TASKS, count=2, threads=4)
    client = ProtocolClient(broker.url, exchange)
    try:
        # Warm up (imports, pools), then take the idle size.
        warm = {client.publish(TOPIC, _noop(-i), correlation_id=uuid.uuid4().hex)
                for i in range(1, 41)}
        for sent in warm:
            client.outcome(sent, WAIT)
        idle = {w.pid: rss_kib(w.pid) or 0 for w in workers}
        client.received.clear()

        with RssSampler([w.pid for w in workers]) as sampler:
            began = time.monotonic()
            sent_ids = [client.publish(TOPIC, _noop(n)) for n in range(BACKLOG)]
            published = time.monotonic() - began
            deadline = began + DRAIN_TIMEOUT
            while len(_successes(client)) < BACKLOG and time.monotonic() < deadline:
                client.drain(0.5)
            drained = time.monotonic() - began
        successes = _successes(client)
    finally:
        client.close()
    peaks = {pid: sampler.peak(pid) for pid in idle}
    assert all(len(sampler.samples[pid]) > 20 for pid in idle), sampler.samples
    print(f"\n[{broker}] {BACKLOG} requests: published in {published:.1f}s, drained in "
          f"{drained:.1f}s; RSS MiB idle/peak: "
          + ", ".join(f"{idle[p] / 1024:.0f}/{peaks[p] / 1024:.0f}" for p in idle))

    assert len(successes) == BACKLOG, f"{len(successes)} of {BACKLOG} completed in {drained:.0f}s"
    assert set(successes) == set(sent_ids) and set(successes.values()) == {1}
    assert [m for m in client.received if m.state == pr.FAILURE] == []
    done = Counter(e["n"] for e in stage.ledger.lines() if e["n"] >= 0)
    assert len(done) == BACKLOG and set(done.values()) == {1}, "some ran twice or never"
    assert {e["pid"] for e in stage.ledger.lines()} == {w.pid for w in workers}
    for pid, peak in peaks.items():
        assert peak - idle[pid] < RSS_BOUND_KIB, (pid, idle[pid], peak)
    assert queued_messages(broker.url, f"{exchange}_{TOPIC}") in (0, None)  # Redis: None
    assert all(w.alive for w in workers), logs(workers)
