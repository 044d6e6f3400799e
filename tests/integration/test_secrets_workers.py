"""Secrets never in clear on the worker side: worker logs, the event stream, dead letters.

The scan of ``tests/behaviour/test_secrets_at_rest.py``, extended to real ``flowengine worker``
processes on Redis and RabbitMQ. One secret is a ``Secret`` store value the task does not list
in its ``secret_args`` (the worker learns it is secret only from the request's header), the
other one the task lists. A task fails quoting both; another kills its worker, so its request
is parked. Then the workers' whole output, every event read from the stream, and the raw
parked messages are searched for a core every encoding of the secrets keeps.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import secret_tasks as st
from event_collector import Collector
from fault_support import flowengine_cli
from wbe_harness import Broker, WorkerFleet, delete_exchange, require_broker, unique_exchange

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.flows import linear_flow
from flowengine.secrets import Secret
from flowengine.worker_based import dead_letters
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.dead_letters import DeadLetters
from flowengine.worker_based.events import EventReceiver

# Slowest test here: 15 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

WAIT = 30.0
TOPIC = "secrets"


def assert_no_secret(where: str, text: str) -> None:
    for core in st.CORES:
        at = text.find(core)
        assert at < 0, f"a secret is in clear in {where}: ...{text[max(0, at - 80):at + 80]}..."


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> Broker:
    return require_broker(request.param)


@pytest.fixture
def fleet(broker: Broker, exchange: str, fleet_factory: Any) -> Iterator[WorkerFleet]:
    made = fleet_factory(broker, exchange, worker_args=["--log-level", "DEBUG"])
    made.start(TOPIC, [st.__name__], count=2, threads=2)
    yield made


#: The dead letters' time to live the engines are given (an hour instead of 14 days).
TTL = 3600.0


def _load(fleet: WorkerFleet, task: Any) -> Any:
    return engines.load(
        linear_flow.Flow(task.name).add(task), engine="worker-based",
        store={"password": Secret(st.PASSWORD), "token": st.TOKEN},
        **fleet.engine_options(TOPIC, transition_timeout=WAIT, lease_timeout=2.0,
                               heartbeat_interval=0.5, max_attempts=1, dead_letter_ttl=TTL,
                               transport_options={"visibility_timeout": 5}))


def test_no_secret_in_worker_logs_events_or_dead_letters(
        broker: Broker, fleet: WorkerFleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    collector = Collector(EventReceiver(fleet.exchange, url=broker.url))
    try:
        leaky = _load(fleet, st.Leak("leaky"))
        with pytest.raises(exc.WrappedFailure, match="ValueError"):
            leaky.run()
        # The worker's own report first: events leave a worker in batches, and the next flow
        # may kill the very worker that ran this one before its batch is out.
        collector.wait_for(lambda es: any(
            e.get("flow_uuid") == leaky.storage.flow_uuid and e["type"] == "task-failed"
            for e in es))
        killer = _load(fleet, st.KillsItsWorker("killer"))
        with pytest.raises(exc.WorkerLost):
            killer.run()
        flows = {leaky.storage.flow_uuid: "task-failed", killer.storage.flow_uuid: "task-lost"}
        events = collector.wait_for(lambda es: all(
            any(e.get("flow_uuid") == f and e["type"] == t for e in es)
            for f, t in flows.items()))
    finally:
        collector.close()
    [failed] = [e for e in events if e["type"] == "task-failed"
                and e.get("flow_uuid") == leaky.storage.flow_uuid]
    assert "***" in failed["exception"], failed  # the worker's own report, masked
    assert_no_secret("the event stream", json.dumps(events))

    outputs = "\n".join(w.log_path.read_text(encoding="utf-8", errors="replace")
                        for w in fleet.workers)
    assert "logging in with" in outputs and "Task leaky[" in outputs
    assert_no_secret("a worker's output", outputs)
    assert_no_secret("the engine's log", "\n".join(
        f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records))

    reader = px.Proxy(ext.DEAD_LETTER_ROUTING_KEY, fleet.exchange, url=broker.url)
    try:
        [parked] = reader.browse(ext.DEAD_LETTER_ROUTING_KEY)
    finally:
        reader.close()
    assert_no_secret("the parked request", parked.body.decode("utf-8", "replace")
                     + json.dumps(parked.headers, default=str))
    assert parked.json()["arguments"] == {}
    # The broker's own TTL (RabbitMQ applies it; Redis ignores it and the sweep applies it).
    assert float(parked.properties["expiration"]) == TTL * 1000

    listed = flowengine_cli("dead-letters", "list", "--json", "--url", broker.url,
                            "--exchange", fleet.exchange)
    [letter] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert letter["removed_arguments"] == ["password", "token"]
    assert letter["expires_at"] == pytest.approx(letter["parked_at"] + TTL)
    refused = flowengine_cli("dead-letters", "requeue", letter["id"], "--url", broker.url,
                             "--exchange", fleet.exchange)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "secret argument(s) 'password', 'token' were removed" in refused.stderr


@pytest.mark.parametrize("broker_name", ["redis", "rabbitmq", "beanstalk"])
def test_dead_letters_expire_on_every_broker(broker_name: str) -> None:
    """Expiry by the clock of whoever looks (an injected one), on real brokers: beanstalkd's
    buried jobs and Redis have no TTL of their own, and the sweep removes what expired."""
    broker = require_broker(broker_name)
    exchange = unique_exchange("dead-expiry")
    parker = px.Proxy(ext.DEAD_LETTER_ROUTING_KEY, exchange, url=broker.url)
    try:
        for name, parked_at in (("old", 1000.0), ("new", 2000.0)):
            request = pr.Request(st.Leak(name), name, pr.EXECUTE, {"token": st.TOKEN})
            dead_letters.park(parker, request, {pr.HEADER_REQUEST_ID: name,
                                                "x-flowengine-secret-args": ["token"]},
                              "lost", TOPIC, ["w1"], reply_to="gone", ttl=TTL,
                              clock=lambda at=parked_at: at)
        late = DeadLetters(exchange, url=broker.url, clock=lambda: 1000.0 + TTL)
        try:
            assert [letter.id for letter in late.list()] == ["new"]
        finally:
            late.close()
        [left] = parker.browse(ext.DEAD_LETTER_ROUTING_KEY)
        assert left.headers[pr.HEADER_REQUEST_ID] == "new"
        assert_no_secret("a parked request", left.body.decode("utf-8", "replace"))
    finally:
        parker.close()
        delete_exchange(broker.url, exchange, [f"{exchange}_{ext.DEAD_LETTER_ROUTING_KEY}"])
