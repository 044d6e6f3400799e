"""``flowengine topics pause|resume`` with a real worker process on each real broker.

While paused, the worker takes nothing new (the requests stay in the queue) and the one it was
running finishes; resume (or the end of ``--for``) takes the backlog up, and nothing is lost.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from fault_support import Stage
from wbe_harness import Broker, ProtocolClient, WorkerFleet, request_body

from flowengine.cli.main import cli
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.events import EventReceiver

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


class TopicEvents:
    """``topic-*`` events of an exchange, collected from a thread."""

    def __init__(self, url: str, exchange: str) -> None:
        self.received: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._stop, listening = threading.Event(), threading.Event()
        receiver = EventReceiver(exchange, url=url, types=("topic-",))

        def listen() -> None:
            for event in receiver.iter(ready=listening.set, stop=self._stop):
                self.received.put(event)

        self._thread = threading.Thread(target=listen, daemon=True)
        self._thread.start()
        assert listening.wait(TIMEOUT), "the event listener never started"

    def next(self, event_type: str) -> dict[str, Any]:
        event = self.received.get(timeout=TIMEOUT)
        assert event["type"] == event_type, event
        return event

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def events(broker: Broker, exchange: str) -> Iterator[TopicEvents]:
    listener = TopicEvents(broker.url, exchange)
    try:
        yield listener
    finally:
        listener.close()


def _topics(broker: Broker, exchange: str, *args: str) -> None:
    result = CliRunner().invoke(cli, ["topics", *args, "--url", broker.url,
                                      "--exchange", exchange])
    assert result.exit_code == 0, result.output


def test_a_paused_topic_takes_nothing_new_and_resume_takes_the_backlog(
    broker: Broker, exchange: str, fleet_factory: Callable[..., WorkerFleet], stage: Stage,
    events: TopicEvents,
) -> None:  # fmt: skip
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [worker] = fleet.start("paused", ["fault_tasks"], threads=4)
    client = ProtocolClient(broker.url, exchange)
    try:
        running = client.publish("paused", request_body("fault_tasks.Gate", "held"))
        client.wait_for(lambda m: m.correlation_id == running and m.state == pr.RUNNING,
                        TIMEOUT, "the gated request running")

        _topics(broker, exchange, "pause", "paused")
        paused = events.next("topic-paused")
        assert paused["worker"] and paused["topic"] == "paused" and paused["in_flight"] == 1
        waiting = [client.publish("paused", request_body("fault_tasks.Noop", f"n{n}", {"n": n}))
                   for n in range(3)]
        stage.gates.open("held")  # the running one finishes while paused
        assert client.outcome(running, TIMEOUT).state == pr.SUCCESS
        client.drain(1.0)  # free slots, a backlog and a second: still nothing taken
        assert not [m for m in client.received if m.correlation_id in waiting], client.received
        assert [e for e in stage.ledger.lines() if "n" in e] == []  # no Noop ran

        _topics(broker, exchange, "resume", "paused")
        assert events.next("topic-resumed")["worker"] == paused["worker"]
        outcomes = [client.outcome(cid, TIMEOUT) for cid in waiting]
        assert sorted(m.body["data"]["result"] for m in outcomes) == [0, 1, 2]

        # A pause with --for ends by itself, and what waited is taken then.
        _topics(broker, exchange, "pause", "paused", "--for", "0.5")
        assert events.next("topic-paused")["seconds"] == 0.5
        later = client.publish("paused", request_body("fault_tasks.Noop", "later", {"n": 9}))
        assert events.next("topic-resumed")["topic"] == "paused"
        assert client.outcome(later, TIMEOUT).body["data"]["result"] == 9
        assert worker.alive
    finally:
        client.close()
