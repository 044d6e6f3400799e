"""Which queues a broker spec declares: quorum queues on RabbitMQ clusters, classic elsewhere."""

from __future__ import annotations

from typing import Any

import pytest

from flowengine.worker_based.broker.connection import (
    DEFAULT_DELIVERY_LIMIT,
    QueueKind,
    queue_kind,
)
from flowengine.worker_based.broker.publisher import Publisher

CLUSTER = "amqp://guest:guest@rabbit1//;amqp://guest:guest@rabbit2//"


@pytest.mark.parametrize("url, driver, options, expected", [
    (CLUSTER, "amqp", {}, QueueKind(True, DEFAULT_DELIVERY_LIMIT)),
    ("amqp://guest:guest@rabbit1//", "amqp", {}, QueueKind()),
    ("amqp://guest:guest@rabbit1//", "amqp", {"queue_type": "quorum"},
     QueueKind(True, DEFAULT_DELIVERY_LIMIT)),
    (CLUSTER, "amqp", {"queue_type": "classic"}, QueueKind()),
    (CLUSTER, "amqp", {"delivery_limit": "5"}, QueueKind(True, 5)),
    (CLUSTER, "amqp", {"delivery_limit": 0}, QueueKind(True, None)),
    ("redis://a:6379/0;redis://b:6379/0", "redis", {}, QueueKind()),
])
def test_the_queue_kind_a_spec_asks_for(url: str, driver: str, options: dict[str, Any],
                                        expected: QueueKind) -> None:
    assert queue_kind(url, driver, options, taskflow_compat=False) == expected


@pytest.mark.parametrize("driver, options, compat, message", [
    ("amqp", {"queue_type": "mirrored"}, False, "must be one of classic, quorum, not 'mirrored'"),
    ("redis", {"queue_type": "quorum"}, False, "transport 'redis' has none"),
    ("amqp", {"queue_type": "quorum"}, True, "cannot be used with taskflow_compat"),
    ("amqp", {"queue_type": "quorum", "delivery_limit": -1}, False, ">= 1 (0: none), not -1"),
    ("amqp", {"queue_type": "quorum", "delivery_limit": "often"}, False, "not 'often'"),
])
def test_a_queue_kind_that_cannot_be_is_refused_by_name(driver: str, options: dict[str, Any],
                                                        compat: bool, message: str) -> None:
    with pytest.raises(ValueError, match="'queue_type'|'delivery_limit'|Quorum") as raised:
        queue_kind("amqp://a//", driver, options, taskflow_compat=compat)
    assert message in str(raised.value)


def test_quorum_declarations_take_no_priority_and_dead_letter_topic_queues_only() -> None:
    publisher = Publisher("orders", url=CLUSTER)
    topic = publisher.queue_for("billing")
    assert topic.max_priority is None
    assert topic.queue_arguments == {
        "x-queue-type": "quorum", "x-delivery-limit": DEFAULT_DELIVERY_LIMIT,
        "x-dead-letter-exchange": "orders", "x-dead-letter-routing-key": "flowengine.dead-letters"}
    assert publisher.queue_for("engine-reply", expires=600.0).queue_arguments == {
        "x-queue-type": "quorum"}
    assert publisher.queue_for("flowengine.dead-letters").queue_arguments == {
        "x-queue-type": "quorum"}
    # A private queue that vanishes with its consumer stays classic (quorum queues are durable).
    assert not publisher.queue_for("control", transient=True).queue_arguments
    # Publishing to a topic declares the dead-letter queue too: the broker drops a dead letter
    # no queue is bound to receive.
    assert [q.name for q in publisher.declarations("billing")] == [
        "orders_flowengine.dead-letters", "orders_billing"]
    classic = Publisher("orders", url="amqp://guest:guest@rabbit1//")
    assert classic.queue_for("billing").max_priority == 9
