"""Defects of the remote wing (worker-based engine and workers) found by fault testing.

Each test shows one defect, with real worker processes on real brokers (private Redis servers
where one is restarted) and the tasks' own execution ledger. A defect known and not fixed yet
is a strict xfail (see doc/testing.rst, "Known defects"): its test fails today only inside its
:func:`~known_defects.shown` block, at the check that sees the defect, and its docstring says
why it passes once the defect is fixed. When it does, the run fails (XPASS strict): remove its
entry from :data:`DEFECTS` (and its mark) in the same change as the fix. The tests of defects
since fixed stay here, unmarked, and say what the fix was.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import fault_tasks as ft
import pytest
import redis
import resume_child
from fault_support import WAIT, EngineRuns, Stage, logs, rabbitmq_queue, wait_until
from known_defects import known_defect
from private_redis import PrivateRedis
from wbe_harness import Broker, ProtocolClient, WorkerFleet, request_body

from flowengine import engines
from flowengine.engines.actions import META_ATTEMPT_IDS
from flowengine.flows import linear_flow as lf
from flowengine.persistence import backends, models
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr

# Slowest test here: 33 s on a loaded 2-core machine (a defect is waited out for 30 s); the
# default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TASKS = [ft.__name__]

F = TypeVar("F", bound=Callable[..., Any])

#: The defects shown here: test name -> the defect (the reason of its strict xfail).
DEFECTS: dict[str, str] = {}


def defect(reason: str) -> Callable[[F], F]:
    """Register the decorated test in :data:`DEFECTS` and mark it a strict xfail for ``reason``."""
    def mark(test: F) -> F:
        DEFECTS[test.__name__] = reason
        return known_defect(reason)(test)

    return mark


@contextlib.contextmanager
def _engine_process(tmp_path: Path, stage: Stage, options: dict[str, Any], factory: str,
                    ) -> Iterator[tuple[subprocess.Popen[str], str, Any, Any]]:
    """An engine process running a new flow of ``resume_child`` (``factory``) stored in SQLite;
    yields the process, the flow's uuid, the store's backend and a connection to it. The
    process is killed at the end if it still runs."""
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
        book = models.LogBook("defects")
        conn.save_logbook(book)
        child = resume_child.start(uri, book.uuid, options, tmp_path / "engine.err", stage.env,
                                   factory)
        try:
            assert child.stdout is not None
            flow_uuid = child.stdout.readline().split()[-1]
            yield child, flow_uuid, backend, conn
        finally:
            child.kill()
            child.wait()


def _occupy(stage: Stage, url: str, exchange: str, topic: str, gate: str) -> None:
    """Have a worker of ``topic`` run the gated task ``gate`` (sent by a bare client, not an
    engine) and wait until it started: a one-thread worker then takes nothing more until the
    gate opens, and no engine knows it is busy."""
    client = ProtocolClient(url, exchange)
    try:
        client.publish(topic, request_body(f"{ft.__name__}.Gate", gate))
        stage.ledger.wait_for(gate, ft.EXECUTE_START)
    finally:
        client.close()


# ---- Redis restarted empty ----------------------------------------------------------------------


def test_a_one_thread_worker_busy_across_an_empty_redis_restart_serves_its_topic_again(
    private_redis: PrivateRedis, exchange: str, fleet_factory: Callable[..., WorkerFleet],
    stage: Stage,
) -> None:  # fmt: skip
    """A one-thread worker running a request while Redis restarts empty serves its topic again.

    Two one-thread workers on a private Redis, each on a topic of its own: one runs a gated
    request across the restart, the other is idle. Redis is restarted without its data, the
    gate opens and the request ends. Both workers must then be reachable on their topics
    again, from a client connected after the restart: discovery (NOTIFY) sent to a topic's
    queue is answered, and a request sent there runs.

    The idle worker answers because its blocking read broke with the connection: it
    reconnected and declared its queue and binding on the new server. The busy one used not to:
    its only task thread was busy, so kombu's Redis consumer was not reading; the redis client
    reconnected silently on the next command; and the consumer's periodic declaration (every
    2 s, meant to heal a server that lost its declarations) was a no-op on a connection that
    had declared the binding once (kombu's channel remembers bindings in process memory). Its
    topic's binding stayed missing, everything published to the topic was dropped unrouted,
    and the discovery below went unanswered for the 30 s allowed. flowengine's Redis channel
    now writes a binding its connection declared before again on every declaration, so the
    binding is back within one declaration period. The client here publishes without
    declaring anything: only the worker's own declarations can route to it.
    """
    broker = Broker("redis", private_redis.url)
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [busy] = fleet.start("busy", TASKS, threads=1)
    [idle] = fleet.start("idle", TASKS, threads=1)
    _occupy(stage, broker.url, exchange, "busy", "across")

    private_redis.stop(keep_data=False)
    private_redis.start()
    stage.gates.open("across")
    stage.ledger.wait_for("across", ft.EXECUTE_END)
    wait_until(lambda: "] succeeded in" in busy.log(), WAIT, "the request's outcome published",
               details=busy.log)

    after = ProtocolClient(broker.url, exchange)
    try:
        # The restart itself is survived by a worker that was idle: the check works.
        after.ping("idle", WAIT)
        try:
            after.ping("busy", WAIT)
        except AssertionError:
            raise AssertionError(f"the worker on topic 'busy' did not answer discovery on "
                                 f"it within {WAIT}s after the restart\n"
                                 f"{logs([busy, idle])}") from None
        outcome = after.outcome(after.publish("busy", request_body(f"{ft.__name__}.Step",
                                                                   "later")), WAIT)
        assert outcome.state == pr.SUCCESS, outcome
        assert [e["pid"] for e in stage.ledger.ends("later")] == [busy.pid]
    finally:
        after.close()


def _queued_on(redis_url: str, queue: str, needle: str) -> bool:
    """Whether a message holding ``needle`` waits in ``queue`` (any of its priority lists)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return any(needle.encode() in entry for key in client.scan_iter(match=f"{queue}*")
                   for entry in client.lrange(key, 0, -1))
    finally:
        client.close()


def test_a_request_whose_replies_redis_lost_is_sent_again(
    private_redis: PrivateRedis, exchange: str, fleet_factory: Callable[..., WorkerFleet],
    stage: Stage, tmp_path: Path,
) -> None:  # fmt: skip
    """A request whose RUNNING reply and outcome the broker lost is sent again, not waited out.

    The engine runs in a process of its own, on a private Redis, with a one-thread worker busy
    with a bare client's request, so the engine's request waits in the topic's queue. The
    engine process is frozen (SIGSTOP); the worker runs the request, and its RUNNING reply and
    outcome wait in the engine's reply queue. Redis then restarts without its data, losing
    both, and the engine thaws. It holds the request as PENDING (sent, never heard of again);
    the flow must still end SUCCESS within the transition timeout (the work may run twice:
    the outcome of the first run was lost, as doc/reliability.rst allows for data loss).

    Only a RUNNING attempt holds a lease, so this was once a known defect: the engine waited
    out ``transition_timeout`` and failed with ``RequestTimeout`` (as a ``data-lost`` run of
    ``test_outage_private_redis.py`` once did, after 120 s). The engine's broker client now
    asks Redis every few seconds whether it still holds the requests sent a while ago that no
    worker said it runs; this one it no longer holds, twice in a row, so the attempt is lost
    and sent again (``test_lost_takes.py`` shows the same for a request a dying worker took),
    the worker runs it again and the flow succeeds well within the 30 s.
    """
    broker = Broker("redis", private_redis.url)
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [worker] = fleet.start("lost", TASKS, threads=1)
    _occupy(stage, broker.url, exchange, "lost", "blocker")
    options = fleet.engine_options("lost", transition_timeout=WAIT, heartbeat_interval=0.5,
                                   lease_timeout=3.0)
    with _engine_process(tmp_path, stage, options, "make_held_flow") as (child, flow_uuid,
                                                                           _backend, conn):
        def sent() -> str | None:
            held = {ad.name: ad for ad in conn.get_flow_details(flow_uuid)}.get("held")
            ids = held.meta.get(META_ATTEMPT_IDS) if held is not None else None
            return ids[-1] if ids and _queued_on(broker.url, f"{exchange}_lost", ids[-1]) \
                else None

        request_id = wait_until(sent, WAIT, "the engine's request waiting in the topic's queue",
                                details=(tmp_path / "engine.err").read_text)
        child.send_signal(signal.SIGSTOP)
        try:
            stage.gates.open("blocker")
            stage.gates.open("held")
            stage.ledger.wait_for("held", ft.EXECUTE_END)
            wait_until(lambda: f"held[{request_id}] succeeded" in worker.log(), WAIT,
                       "the outcome published (to the frozen engine's reply queue)",
                       details=worker.log)
            private_redis.stop(keep_data=False)
            private_redis.start()
        finally:
            child.send_signal(signal.SIGCONT)
        assert child.stdout is not None
        out, _ = child.communicate(timeout=2 * WAIT)
        err = (tmp_path / "engine.err").read_text()
    assert "RequestTimeout" not in err, f"the engine waited the request out:\n{err[-3000:]}"
    assert child.returncode == 0 and "final SUCCESS" in out, err[-3000:]
    assert 1 <= len(stage.ledger.starts("held")) <= 2, stage.ledger.dump()


# ---- frozen workers on RabbitMQ ------------------------------------------------------------------

TOPIC = "defects"
#: Short leases, as in test_faults.py: a silent worker's request runs again within seconds.
LEASE = {"lease_timeout": 2.0, "heartbeat_interval": 0.5}
#: Upper bound of a lease lapse's detection: the lease plus housekeeping and dispatch slack.
LAPSE_BOUND = 2.0 + 3.0
#: Upper bound of the wait of a request a frozen worker took unstarted: the pickup timeout,
#: the lease it has to answer in (twice, if the engine's replies were backlogged), and slack.
HELD_BOUND = ext.DEFAULT_PICKUP_TIMEOUT + 2 * LEASE["lease_timeout"] + 3.0
#: AMQP heartbeat of the workers' connections (seconds): RabbitMQ drops a frozen worker's
#: connection (and redelivers what it held) only after about two of them, long after the test.
LONG_HEARTBEAT = 60
#: Discovery requests waiting on a frozen worker's control queue when it thaws: engine
#: processes ask every 5 s, so a fleet of 100 of them leaves this many during a 25 s freeze.
FREEZE_BACKLOG = 500


class FrozenHolder:
    """A frozen worker of :data:`TOPIC` on RabbitMQ holding an engine's request unstarted.

    One worker (``busy``, one thread) runs a gated request of a bare client, so it takes
    nothing more. The other (``frozen``) is frozen with SIGSTOP while idle; RabbitMQ keeps
    filling a frozen consumer's free prefetch slots (one per thread), so it takes the next
    messages of the topic's queue: the engine's request, and discovery requests (a process's
    broker client asks each topic for its workers twice as it starts, before its first request,
    then every 5 s). Given as many slots as it then takes, it is full once it holds the
    request, and a request sent again later goes to the busy worker once that is free. Its
    AMQP heartbeat is long (:data:`LONG_HEARTBEAT`): the broker does not drop it meanwhile.
    :meth:`thaw` makes sure it held the request.

    Args:
        known: Let this process's engines know the frozen worker (a flow runs on it before it
            is frozen; the request is sent before the next discovery request); otherwise it is
            frozen before any engine of the test asks for workers (the request follows the
            two discovery requests of a new client), and engines know only the busy worker.
    """

    def __init__(self, broker: Broker, exchange: str, fleet_factory: Callable[..., WorkerFleet],
                 stage: Stage, runs: EngineRuns, known: bool) -> None:
        self.url, self.exchange, self.stage = broker.url, exchange, stage
        self.fleet = fleet_factory(broker, exchange, env=stage.env,
                                   url=f"{broker.url}?heartbeat={LONG_HEARTBEAT}")
        [self.busy] = self.fleet.start(TOPIC, TASKS, threads=1)
        _occupy(stage, broker.url, exchange, TOPIC, "blocker")
        self.slots = 2 if known else 3
        [self.frozen] = self.fleet.start(TOPIC, TASKS, threads=self.slots)
        # Its control queue too, or a CANCEL sent while it is frozen never reaches it.
        wait_until(lambda: f"consuming queue {exchange}_flowengine.worker." in self.frozen.log(),
                   WAIT, "the frozen worker's control queue consumed", details=self.frozen.log)
        if known:
            warm = runs.start(self.load(lf.Flow("warm").add(ft.Step("warm"))), "warm")
            assert warm.join(WAIT) is None, logs(self.fleet.workers)
        self.frozen.signal(signal.SIGSTOP)

    @property
    def options(self) -> dict[str, Any]:
        """Options of engines on :data:`TOPIC` (short leases, a long transition timeout)."""
        return self.fleet.engine_options(TOPIC, transition_timeout=4 * WAIT, **LEASE)

    def load(self, flow: Any) -> Any:
        return engines.load(flow, engine="worker-based", **self.options)

    def wait_full(self) -> None:
        """Until the frozen worker's slots are all taken (and the busy one's): once the request
        was sent, it is in one of them (:meth:`thaw` makes sure)."""
        queue = f"{self.exchange}_{TOPIC}"
        wait_until(lambda: (rabbitmq_queue(queue) or (0, 0))[1] == 1 + self.slots, WAIT,
                   "the frozen worker's slots taken", interval=0.5,
                   details=lambda: rabbitmq_queue(queue))

    def discovery_backlog(self, count: int) -> None:
        """Queue ``count`` discovery requests for every worker (on their control queues), as
        engine processes send them every 5 s (the answers are not read)."""
        client = ProtocolClient(self.url, self.exchange)
        try:
            for _ in range(count):
                client.publish(ext.DISCOVER_ROUTING_KEY, {}, type=pr.NOTIFY,
                               correlation_id=None)
        finally:
            client.close()

    def free_the_busy_one(self) -> None:
        self.stage.gates.open("blocker", pid=self.busy.pid)
        self.stage.ledger.wait_for("blocker", ft.EXECUTE_END)

    def thaw(self) -> None:
        """SIGCONT, then make sure it had held the request (not two discovery requests)."""
        self.frozen.signal(signal.SIGCONT)
        wait_until(lambda: re.search(r"Task held\[\w+\] received", self.frozen.log(200)),
                   WAIT, "the thawed worker receiving the request it held (if it never does, "
                   "this test did not set up what it shows)", details=self.frozen.log)

    def started_by_frozen(self) -> list[dict[str, Any]]:
        """The ledger's starts of ``held`` in the frozen worker."""
        return [e for e in self.stage.ledger.starts("held") if e["pid"] == self.frozen.pid]

    def wait_settled(self) -> None:
        """Until the thawed worker is done with the request it held: dropped unrun (revoked,
        or handed back to its engine) or run."""
        def settled() -> bool:
            log = self.frozen.log(200)
            return ("its engine revoked it" in log or "Handing back request" in log
                    or any(e["pid"] == self.frozen.pid for e in self.stage.ledger.ends("held")))

        wait_until(settled, WAIT, "the thawed worker settling the request it held",
                   details=self.frozen.log)



def _frozen_holder(known: bool) -> Callable[..., Iterator[FrozenHolder]]:
    def fixture(rabbitmq_broker: Broker, exchange: str,
                fleet_factory: Callable[..., WorkerFleet], stage: Stage, runs: EngineRuns,
                ) -> Iterator[FrozenHolder]:
        holder = FrozenHolder(rabbitmq_broker, exchange, fleet_factory, stage, runs, known)
        try:
            yield holder
        finally:
            holder.frozen.signal(signal.SIGCONT)
            stage.gates.open("held")

    return fixture


#: A frozen worker the engines of the test know (see :class:`FrozenHolder`).
known_frozen = pytest.fixture(_frozen_holder(known=True), name="known_frozen")
#: A frozen worker no engine of the test has heard of.
unknown_frozen = pytest.fixture(_frozen_holder(known=False), name="unknown_frozen")


def test_a_request_a_frozen_worker_took_without_starting_it_runs_elsewhere(
    known_frozen: FrozenHolder, stage: Stage, runs: EngineRuns,
) -> None:  # fmt: skip
    """A request taken, not started, by a worker then frozen runs on another worker, as one
    the frozen worker had started does (``test_faults.py``, after its lease lapses).

    The frozen worker holds the request unstarted on RabbitMQ (its AMQP heartbeat is long, so
    the broker does not give it back during the test), and the other worker is free moments
    later. It must run the request within ``HELD_BOUND`` (twice over), long before the broker
    would give it back.

    It used not to: the engine heard no RUNNING, so the attempt held no lease, and nothing
    else sent it again (the pickup check passed over a silent *topic* only, and both workers
    share it): it waited for the frozen worker to thaw, or for the broker to drop that
    worker's connection (about two AMQP heartbeats). Now a request that waits untaken for
    ``pickup_timeout`` makes the engine ask the topic's workers it has not heard from lately
    for a proof of life; the frozen one leaves it unanswered for a lease, so the engine
    revokes the request and sends it to the free worker, and the flow ends. The thawed
    worker drops the revoked request unrun (``wait_settled``).
    """
    holder = known_frozen
    run = runs.start(holder.load(lf.Flow("frozen").add(ft.Gate("held"))))
    holder.wait_full()
    holder.free_the_busy_one()
    try:
        stage.ledger.wait_for("held", ft.EXECUTE_START, timeout=2 * HELD_BOUND,
                              where=lambda e: e["pid"] == holder.busy.pid)
    finally:
        holder.thaw()
    stage.gates.open("held")
    assert run.join(WAIT) is None, logs(holder.fleet.workers)
    holder.wait_settled()
    assert holder.started_by_frozen() == [], (
        f"the thawed worker ran the request sent elsewhere\n{stage.ledger.dump()}")


def test_a_thawed_worker_does_not_run_a_request_a_resumed_engine_revoked(
    unknown_frozen: FrozenHolder, stage: Stage, runs: EngineRuns, tmp_path: Path,
) -> None:  # fmt: skip
    """A request revoked by a resumed engine while a frozen worker held it is not run on thaw.

    The engine process that sent the request is killed while the frozen worker holds it
    unstarted; a new engine resumes the flow, tells every worker not to run the dead engine's
    request (CANCEL), and sends it again: the free worker runs the new attempt. Then the frozen
    worker thaws with both the old request and the CANCEL waiting for it. doc/reliability.rst
    promises that "a worker that was busy or frozen settles the old request unrun when it
    reaches it".

    It used to run it: on thaw its topic consumer handed the request to a task thread before
    its control consumer had recorded the revocation, so the check made before RUNNING found
    nothing revoked (the ledger showed the frozen worker starting the task after the new
    attempt ran). The race is made certain as a real fleet makes it: the CANCEL waits on the
    control queue behind the discovery requests engines sent during the freeze
    (:data:`FREEZE_BACKLOG`); with none, the request won it in about half the runs. Now a
    request whose worker's control consumer has not found its queue empty lately (it froze
    with the process) starts only once it has (``server.CONTROL_LAG``), so the worker drops
    it unrun, saying so ("its engine revoked it"), and only the new attempt runs.
    """
    holder = unknown_frozen
    with _engine_process(tmp_path, stage, holder.options, "make_held_flow") as (
            child, flow_uuid, backend, conn):
        holder.wait_full()
        child.kill()
        child.wait()
        holder.discovery_backlog(FREEZE_BACKLOG)
        engine = engines.load_from_detail(conn.get_flow_details(flow_uuid), backend=backend,
                                          engine="worker-based", **holder.options)
        run = runs.start(engine, "resumed")
        holder.free_the_busy_one()
        # The new attempt runs on the free worker: the CANCEL went out before it was sent.
        stage.ledger.wait_for("held", ft.EXECUTE_START,
                              where=lambda e: e["pid"] == holder.busy.pid)
        stage.gates.open("held")
        assert run.join(WAIT, details=stage.ledger.dump) is None
    holder.thaw()
    holder.wait_settled()
    assert holder.started_by_frozen() == [], (
        f"the thawed worker ran the request the resumed engine had revoked\n"
        f"{stage.ledger.dump()}\n{holder.frozen.log(40)}")


def test_a_worker_going_offline_does_not_make_another_workers_request_run_twice(
    unknown_frozen: FrozenHolder, stage: Stage, runs: EngineRuns,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A worker going offline costs no second run of a request another worker holds.

    The engine sends the request to the topic presuming the busy worker will take it (the
    only one it knows); the frozen worker, which the engine has never heard of, takes it. A
    spare worker starts, the busy one finishes its own work and is stopped with SIGTERM: it
    announces that it is going offline, holding nothing. Then the frozen worker thaws. The
    request's work must be done once.

    It used to be done twice: on the offline announcement the engine sent again every request
    it presumed that worker held ("is lost: its worker ... went offline") without revoking
    it, so the spare worker ran it and the flow ended; the thawed worker then ran the one it
    held, after its atom completed (the ledger showed two starts). Now a lost attempt no
    worker was heard running is revoked (a CANCEL of its id) as it is sent again, and the
    thawed worker reads that CANCEL before it starts the request (see the test above): the
    spare worker runs the new attempt, the thawed one drops the old one unrun. The spare
    worker's start is waited for only as long as a lease lapse (``LAPSE_BOUND``, twice
    over), in case a later change keeps the request for its real holder instead.
    """
    caplog.set_level("INFO", logger="flowengine.worker_based")
    holder = unknown_frozen
    run = runs.start(holder.load(lf.Flow("offline").add(ft.Gate("held"))))
    holder.wait_full()
    [spare] = holder.fleet.start(TOPIC, TASKS, threads=1)
    holder.free_the_busy_one()
    assert holder.busy.stop() == 0, holder.busy.log()
    with contextlib.suppress(AssertionError):  # see the docstring
        stage.ledger.wait_for("held", ft.EXECUTE_START, timeout=2 * LAPSE_BOUND,
                              where=lambda e: e["pid"] == spare.pid)
    stage.gates.open("held")
    holder.thaw()
    assert run.join(WAIT, details=stage.ledger.dump) is None
    holder.wait_settled()
    assert len(stage.ledger.starts("held")) == 1, (
        "the request's work was done twice\n" + stage.ledger.dump() + "\n--- engine\n"
        + "\n".join(r.getMessage() for r in caplog.records if "'held'" in r.getMessage()))
