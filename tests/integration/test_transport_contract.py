"""The transport contract: what flowengine needs of a broker, checked on every transport.

Each case runs on kombu's memory transport, flowengine-fs, and real Redis, RabbitMQ and
beanstalkd (:data:`wbe_harness.TRANSPORTS`), through flowengine's own broker edge (a
:class:`~flowengine.worker_based.broker.proxy.Proxy` publishing, consuming and settling), so a
transport flowengine adds, or a kombu upgrade, is held to the same promises the engine and the
workers build on: a message arrives once with its properties and headers; one taken but never
settled comes back once its consumer is gone (a worker killed mid-task); one given back is
delivered again, one refused is not; the prefetch bounds what a consumer holds; a queue can be
read without taking (``browse``), one message taken out of it (``take``), and deleted.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wbe_harness import TRANSPORTS

from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker.delivery import Delivery

pytestmark = pytest.mark.integration

#: Seconds a case waits for something the consumer thread does.
WAIT = 15.0
TOPIC = "contract"


class Consumer:
    """A consuming Proxy on its own thread whose handler records each delivery and settles it
    as ``settle`` says (None: leave it unsettled)."""

    def __init__(self, where: dict[str, Any], exchange: str,
                 settle: Callable[[Delivery, int], str | None],
                 prefetch: int | None = None) -> None:
        self.deliveries: list[Delivery] = []
        self._settle = settle
        self._arrived = threading.Condition()
        handler = dp.Handler(self._on_message,
                             functools.partial(pr.Notify.validate, response=True),
                             manual_ack=True)
        self.proxy = px.Proxy(TOPIC, exchange, {pr.NOTIFY: handler}, prefetch_count=prefetch,
                              **where)
        self._thread = threading.Thread(target=self.proxy.start, daemon=True,
                                        name=f"contract-consumer-{exchange}")

    def _on_message(self, _data: Any, delivery: Delivery) -> None:
        with self._arrived:
            self.deliveries.append(delivery)
            seen = sum(1 for d in self.deliveries if d.correlation_id == delivery.correlation_id)
            self._arrived.notify_all()
        action = self._settle(delivery, seen)
        if action is not None:
            getattr(delivery, action)()

    def start(self) -> Consumer:
        self._thread.start()
        assert self.proxy.wait(WAIT), "the consumer did not start consuming"
        return self

    def wait_for(self, count: int) -> list[Delivery]:
        """The deliveries once there are at least ``count`` of them."""
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.deliveries) >= count, WAIT), (
                f"{len(self.deliveries)} of {count} deliveries arrived")
            return list(self.deliveries)

    def settled_round(self) -> None:
        """Wait for two whole consume cycles: what was due has arrived, and been settled."""
        for _ in range(2):
            assert self.proxy.wait_drained(WAIT)

    def stop(self) -> None:
        self.proxy.stop()
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the consumer did not stop"
        self.proxy.close()


@pytest.fixture(params=sorted(TRANSPORTS))
def where(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    return TRANSPORTS[request.param](tmp_path)


@pytest.fixture
def exchange() -> str:
    return f"contract-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def publisher(where: dict[str, Any], exchange: str) -> Iterator[px.Proxy]:
    made = px.Proxy(TOPIC, exchange, {}, **where)
    try:
        yield made
    finally:
        made.delete_own_queue()
        made.close()


@pytest.fixture
def consumers(where: dict[str, Any], exchange: str) -> Iterator[Callable[..., Consumer]]:
    made: list[Consumer] = []

    def consumer(settle: Callable[[Delivery, int], str | None],
                 prefetch: int | None = None) -> Consumer:
        made.append(Consumer(where, exchange, settle, prefetch).start())
        return made[-1]

    try:
        yield consumer
    finally:
        for one in made:
            if one.proxy.is_running:
                one.stop()


def send(proxy: px.Proxy, name: str, **options: Any) -> str:
    """Publish a NOTIFY reply named ``name``; return its correlation id."""
    correlation_id = f"{name}-{uuid.uuid4().hex[:8]}"
    proxy.publish(pr.Notify(topic=name, tasks=[f"tasks.{name}"]), TOPIC,
                  correlation_id=correlation_id, **options)
    return correlation_id


def ack(_delivery: Delivery, _seen: int) -> str:
    return "ack"


def test_a_message_arrives_once_with_its_properties_and_headers(
        publisher: px.Proxy, consumers: Callable[..., Consumer]) -> None:
    consumer = consumers(ack)
    sent = send(publisher, "one", reply_to="back-here",
                headers={"x-contract": "ünïcode ✓", "x-contract-number": 7})
    [delivery] = consumer.wait_for(1)
    assert delivery.type == pr.NOTIFY
    assert (delivery.correlation_id, delivery.reply_to) == (sent, "back-here")
    assert delivery.headers["x-contract"] == "ünïcode ✓"
    assert delivery.headers["x-contract-number"] == 7
    assert delivery.body["topic"] == "one" and delivery.body["tasks"] == ["tasks.one"]
    consumer.settled_round()
    assert len(consumer.deliveries) == 1, "delivered more than once"
    assert publisher.browse(TOPIC) == []


def test_a_message_taken_but_never_settled_comes_back_once_its_consumer_is_gone(
        publisher: px.Proxy, consumers: Callable[..., Consumer]) -> None:
    dying = consumers(lambda _d, _n: None)  # takes it and never settles: a worker killed
    sent = send(publisher, "orphan")
    dying.wait_for(1)
    dying.stop()
    heir = consumers(ack)
    [delivery] = heir.wait_for(1)
    assert delivery.correlation_id == sent
    heir.settled_round()
    assert len(heir.deliveries) == 1


def test_a_message_given_back_is_delivered_again_and_a_refused_one_is_not(
        publisher: px.Proxy, consumers: Callable[..., Consumer]) -> None:
    def settle(delivery: Delivery, seen: int) -> str:
        if delivery.body["topic"] == "refused":
            return "reject"
        return "requeue" if seen == 1 else "ack"

    consumer = consumers(settle)
    refused = send(publisher, "refused")
    again = send(publisher, "again")
    got = consumer.wait_for(3)
    consumer.settled_round()
    ids = [d.correlation_id for d in consumer.deliveries]
    assert ids.count(again) == 2, ids
    assert ids.count(refused) == 1, ids
    assert len(got) <= len(consumer.deliveries) == 3
    assert publisher.browse(TOPIC) == []


def test_the_prefetch_bounds_what_a_consumer_holds_unsettled(
        publisher: px.Proxy, consumers: Callable[..., Consumer]) -> None:
    held: list[Delivery] = []
    consumer = consumers(lambda delivery, _seen: held.append(delivery), prefetch=2)
    for n in range(5):
        send(publisher, f"m{n}")
    consumer.wait_for(2)
    consumer.settled_round()
    assert len(consumer.deliveries) == 2, "the consumer took more than its prefetch"
    held[0].ack()
    consumer.wait_for(3)
    consumer.settled_round()
    assert len(consumer.deliveries) == 3
    for delivery in list(held):
        delivery.ack()
    consumer.wait_for(5)


def test_a_queue_is_read_without_taking_one_message_taken_out_and_deleted(
        publisher: px.Proxy) -> None:
    sent = [send(publisher, name) for name in ("first", "second", "third")]
    browsed = publisher.browse(TOPIC)
    assert [m.properties.get("correlation_id") for m in browsed] == sent
    assert len(publisher.browse(TOPIC)) == 3, "browsing took messages"
    taken = publisher.take(TOPIC, lambda m: m.json()["topic"] == "second")
    assert taken is not None and taken.properties.get("correlation_id") == sent[1]
    assert [m.json()["topic"] for m in publisher.browse(TOPIC)] == ["first", "third"]
    assert publisher.take(TOPIC, lambda m: m.json()["topic"] == "second") is None
    publisher.delete_own_queue()
    assert publisher.browse(TOPIC) == []
