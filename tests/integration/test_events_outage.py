"""The event stream across a broker restart: what is published once the broker is back arrives.

A process's event publisher keeps one connection between bursts. When its broker restarts (or
its cluster node dies) that connection is dead without anyone knowing until the next publish,
and the burst that follows the loss (a flow's ends, typically) used to be dropped whole on it.
Run on the shared Redis and RabbitMQ, which :func:`fault_support.broker_outage` stops and
starts again.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fault_support import WAIT, broker_outage, wait_until
from wbe_harness import Broker, require_broker

from flowengine.worker_based.broker import broadcast as bc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: How long the broker stays down.
OUTAGE = 1.0


class Listener:
    """A broadcast listener on a thread; the documents it received land in ``received``."""

    def __init__(self, broadcast: bc.Broadcast) -> None:
        self.received: list[Any] = []
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(broadcast,), daemon=True)

    def _run(self, broadcast: bc.Broadcast) -> None:
        for document in broadcast.listen(self._stop.is_set, ready=self._ready.set):
            self.received.append(document)

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(WAIT), "the listener never became ready"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)

    def got(self, document: Any) -> bool:
        return document in self.received


@pytest.fixture(params=["redis", "rabbitmq"])
def restartable(request: pytest.FixtureRequest) -> Broker:
    return require_broker(request.param)


@pytest.fixture
def listener(restartable: Broker) -> Iterator[tuple[Listener, str]]:
    exchange = f"outage-{uuid.uuid4().hex[:8]}.events"
    listening = Listener(bc.Broadcast(exchange, url=restartable.url))
    listening.start()
    yield listening, exchange
    listening.stop()


@pytest.mark.exclusive  # stops the Redis and RabbitMQ every other test uses
def test_events_published_after_a_broker_restart_arrive_on_the_old_connection(
        restartable: Broker, listener: tuple[Listener, str]) -> None:
    listening, exchange = listener
    sender = bc.Broadcast(exchange, url=restartable.url)
    try:
        sender.publish([{"n": 1}])  # opens the connection the restart will kill
        wait_until(lambda: listening.got({"n": 1}), WAIT, "the first document")
        with broker_outage(restartable, OUTAGE):
            pass
        # The listener listens again on its own (through a new queue); a fresh publisher's
        # probes show when it does.
        probe = bc.Broadcast(exchange, url=restartable.url)
        try:
            count = iter(range(1_000_000))
            wait_until(lambda: probe.publish([{"probe": next(count)}]) or any(
                "probe" in d for d in listening.received), WAIT, "the listener back",
                interval=0.1)
        finally:
            probe.close()
        sender.publish([{"n": 2}, {"n": 3}])  # on the connection the restart killed
        wait_until(lambda: listening.got({"n": 3}), WAIT, "documents sent after the restart",
                   lambda: listening.received)
        assert listening.got({"n": 2})
    finally:
        sender.close()
