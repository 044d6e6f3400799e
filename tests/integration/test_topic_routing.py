"""An engine sends work only to the topics it lists, and only to workers that take it.

Real ``flowengine worker`` processes on Redis, RabbitMQ and beanstalkd write a ledger line per
task with their pid, so the ledger says which worker ran what.

- Two cells on one exchange: an engine of ``cell1`` runs every task on the ``cell1`` worker,
  though the ``cell2`` worker answers the engine's discovery broadcast like every flowengine
  worker on the exchange (it used to get about half of the work).
- 10,000 forged announcements of workers on a topic the engine does not list, each claiming
  the tasks and every slot free: the flow runs on the one real worker, well within its
  transition timeout (it used to wait that timeout out for every task sent to a forger).
- A silent "worker" that announces itself on a topic the engine does list and never consumes:
  each request sent to it is passed over after ``pickup_timeout`` and runs on the real worker;
  a worker that takes its requests (however long they run) is never passed over.
- With a signing key, an unsigned announcement is refused: the forger is never routed to.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import fault_tasks as ft
import kombu
import pytest
from fault_support import WAIT, Stage, wait_until
from wbe_harness import BROKER_CONNECT_TIMEOUT, Broker, WorkerFleet, WorkerProcess

from flowengine import engines, states
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.executor import WorkerTaskExecutor

pytestmark = pytest.mark.integration

TASKS = 15
FORGED = 10_000
#: Long enough that reaching it shows a request stranded on a forged or silent worker.
TRANSITION_TIMEOUT = 60.0
PICKUP_TIMEOUT = 2.0
NOOP = f"{ft.__name__}.Noop"
KEY = "remote-guard-signing-key-0123456789"


def _flow(name: str, count: int = TASKS) -> Any:
    return uf.Flow(name).add(*[ft.Noop(f"{name}-{i}", inject={"n": i}) for i in range(count)])


def _ran_by(stage: Stage) -> Counter[int]:
    """How many tasks each worker process ran."""
    return Counter(line["pid"] for line in stage.ledger.events(event=ft.EXECUTE_END))


@pytest.fixture
def fleet(broker: Broker, exchange: str, fleet_factory: Any, stage: Stage) -> WorkerFleet:
    made: WorkerFleet = fleet_factory(broker, exchange, env=stage.env)
    return made


@pytest.fixture
def executor(fleet: WorkerFleet) -> Iterator[Any]:
    """Makes a started executor of ``fleet``'s exchange (stopped at the end), so forged
    announcements published afterwards reach its process's reply queue."""
    made: list[WorkerTaskExecutor] = []

    def make(topics: list[str], **options: Any) -> WorkerTaskExecutor:
        executor = WorkerTaskExecutor(uuid.uuid4().hex, fleet.exchange, topics, url=fleet.url,
                                      **options)
        executor.start()
        made.append(executor)
        return executor

    try:
        yield make
    finally:
        for executor in made:
            executor.stop()


def _announce(fleet: WorkerFleet, topic: str, count: int, signed_by: str | None = None,
              prefix: str = "forged") -> None:
    """Publish ``count`` announcements of made-up flowengine workers on ``topic``, each
    claiming every task and all of :data:`signing.MAX_PLAUSIBLE_CAPACITY` slots free."""
    from flowengine.worker_based import signing as sg

    exchange = kombu.Exchange(fleet.exchange, type="direct", durable=True, auto_delete=False)
    body = kombu.serialization.dumps({"topic": topic, "tasks": [NOOP]}, serializer="json")[2]
    signing = sg.Signing(sg.load_key(signed_by)) if signed_by else None
    with kombu.Connection(fleet.broker.url, connect_timeout=BROKER_CONNECT_TIMEOUT) as conn:
        producer = kombu.Producer(conn.channel(), exchange=exchange)
        for i in range(count):
            headers = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION,
                       pr.HEADER_WORKER: f"{prefix}-{i}", pr.HEADER_ORIGIN: f"nowhere:{i}",
                       pr.HEADER_CAPACITY: sg.MAX_PLAUSIBLE_CAPACITY,
                       pr.HEADER_WORKER_STATUS: pr.WORKER_ONLINE}
            properties = {"type": pr.NOTIFY}
            if signing is not None:
                headers = signing.sign(body.encode(), properties, headers)
            producer.publish(body, routing_key=pr.DISCOVERY_ROUTING_KEY,
                             content_type="application/json", content_encoding="utf-8",
                             headers=headers, **properties)


def _heard(executor: WorkerTaskExecutor, identity: str) -> None:
    """Wait until ``executor``'s process heard of worker ``identity`` (the last one announced:
    they arrive in order)."""
    wait_until(lambda: identity in {w.identity for w in executor.client.known_workers()},
               2 * WAIT, f"announcement of {identity!r} heard by the engine's process")


def _runs_on(real: WorkerProcess, stage: Stage, engine: Any) -> None:
    """``engine`` runs every task on ``real``, well within its transition timeout (reaching it
    would mean a request waited on a worker that never took it)."""
    started = time.monotonic()
    engine.run()
    took = time.monotonic() - started
    print(f"\n{engine.storage.flow_name}: {TASKS} tasks in {took:.2f}s")
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert _ran_by(stage) == {real.pid: TASKS}, stage.ledger.dump()
    assert took < TRANSITION_TIMEOUT / 2, f"took {took:.1f}s: requests waited on a non-worker"


def test_an_engine_runs_every_task_on_its_own_topic(fleet: WorkerFleet, stage: Stage) -> None:
    [cell1] = fleet.start("cell1", [ft.__name__], threads=2)
    [cell2] = fleet.start("cell2", [ft.__name__], threads=2)
    engine = engines.load(_flow("cells"), engine="worker-based", **fleet.engine_options(
        "cell1", transition_timeout=WAIT))

    engine.run()

    assert _ran_by(stage) == {cell1.pid: TASKS}, (cell1.pid, cell2.pid, stage.ledger.dump())


def test_forged_announcements_for_another_topic_do_not_stall_the_flow(
    fleet: WorkerFleet, stage: Stage, executor: Any,
) -> None:  # fmt: skip
    [real] = fleet.start("cell1", [ft.__name__], threads=2)
    ex = executor(["cell1"], transition_timeout=TRANSITION_TIMEOUT)
    _announce(fleet, "elsewhere", FORGED)
    _heard(ex, f"forged-{FORGED - 1}")
    _runs_on(real, stage, engines.load(_flow("forged"), engine="worker-based", executor=ex))


def test_a_silent_worker_on_a_listed_topic_is_passed_over(
    fleet: WorkerFleet, stage: Stage, executor: Any, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="flowengine.worker_based")
    [real] = fleet.start("cell1", [ft.__name__], threads=2)
    ex = executor(["cell1", "silent"], transition_timeout=TRANSITION_TIMEOUT,
                  pickup_timeout=PICKUP_TIMEOUT)
    _announce(fleet, "silent", 1)  # the most free slots: the first choice for every task
    _heard(ex, "forged-0")
    # One wait of the bound for the first batch, then nothing goes to the silent topic.
    _runs_on(real, stage, engines.load(_flow("silent"), engine="worker-based", executor=ex))
    passed = [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()]
    assert passed and all("'silent'" in line for line in passed), passed


def test_a_busy_worker_that_takes_its_requests_is_not_passed_over(
    fleet: WorkerFleet, stage: Stage, executor: Any, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """One task thread, tasks much longer than the bound: requests wait in the queue behind
    the running one, whose heartbeats show the topic is served."""
    caplog.set_level(logging.INFO, logger="flowengine.worker_based")
    [busy] = fleet.start("cell1", [ft.__name__], threads=1)
    [other] = fleet.start("cell2", [ft.__name__], threads=1)
    ex = executor(["cell1", "cell2"], transition_timeout=TRANSITION_TIMEOUT,
                  pickup_timeout=PICKUP_TIMEOUT, heartbeat_interval=0.5, lease_timeout=5.0)
    flow = uf.Flow("busy").add(*[ft.Slow(f"slow-{i}", inject={"seconds": 2 * PICKUP_TIMEOUT})
                                 for i in range(4)])
    engine = engines.load(flow, engine="worker-based", executor=ex)

    engine.run()

    starts = [line for line in stage.ledger.events(event=ft.EXECUTE_START)]
    assert Counter(line["atom"] for line in starts) == {f"slow-{i}": 1 for i in range(4)}
    assert {line["pid"] for line in starts} <= {busy.pid, other.pid}
    assert not [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()]


def test_with_a_signing_key_unsigned_announcements_are_refused(
    fleet: WorkerFleet, executor: Any,
) -> None:  # fmt: skip
    fleet.env["FLOWENGINE_SIGNING_KEY"] = KEY
    [real] = fleet.start("cell1", [ft.__name__], threads=2)
    ex = executor(["cell1"], transition_timeout=TRANSITION_TIMEOUT, signing_key=KEY)
    _announce(fleet, "cell1", 50, prefix="unsigned")  # on the engine's own topic
    _announce(fleet, "cell1", 1, signed_by=KEY, prefix="signed")  # after them, in order
    wait_until(lambda: ex.finder.get("signed-0") is not None, WAIT, "the signed announcement")
    known = {w.identity for w in ex.finder.workers()}
    assert not [i for i in known if i.startswith("unsigned-")], sorted(known)
    assert real.alive
