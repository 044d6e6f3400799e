"""Which brokers get quiet starts by default (engine option ``quiet_start``), on the real ones.

A short task that replies with its outcome alone holds no lease while it runs, so a worker
killed or frozen in its first moments is found only when the broker hands its request back.
RabbitMQ does that as soon as the worker's connection drops or misses its AMQP heartbeats;
Redis only after its visibility timeout (a chaos run of conductors on Redis left such an
attempt PENDING for a minute). So a default engine lets workers start short tasks quietly on
RabbitMQ only: its requests say protocol 2 there and protocol 1 (RUNNING first) elsewhere. The
option decides either way. A scripted consumer of the topic reads what the engine sent.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from wbe_harness import Broker, delete_exchange, require_broker

from flowengine import task
from flowengine.engines.executor import EXECUTED
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.executor import WorkerTaskExecutor

TOPIC = "quiet-start"
WAIT = 30.0


class Short(task.Task):
    def execute(self) -> str:
        return "done"


TASK_CLS = pr.task_class_name(Short)


class Consumer:
    """Takes the topic's requests and answers each with SUCCESS (and NOTIFY with its tasks)."""

    def __init__(self, broker: Broker, exchange: str) -> None:
        self.protocols: queue.Queue[object] = queue.Queue()
        handlers = {pr.REQUEST: dp.Handler(self._on_request),
                    pr.NOTIFY: dp.Handler(self._on_notify)}
        self.proxy = px.Proxy(TOPIC, exchange, handlers, url=broker.url)
        self._headers = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION,
                         pr.HEADER_WORKER: f"scripted-{uuid.uuid4().hex[:6]}"}

    def _on_request(self, data: Any, message: Any) -> None:
        self.protocols.put((message.headers or {}).get(pr.HEADER_PROTOCOL))
        self.proxy.publish(pr.Response(pr.SUCCESS, result="done"),
                           message.properties["reply_to"],
                           correlation_id=message.properties["correlation_id"],
                           headers=self._headers, declare_queue=False)

    def _on_notify(self, data: Any, message: Any) -> None:
        self.proxy.publish(pr.Notify(topic=TOPIC, tasks=[TASK_CLS]),
                           message.properties["reply_to"], headers=self._headers,
                           declare_queue=False)  # the engine's own: declared by it


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> Broker:
    """RabbitMQ, and Redis for every broker whose connections carry no heartbeats."""
    return require_broker(request.param)


@pytest.fixture
def consumer(broker: Broker, exchange: str) -> Iterator[Consumer]:
    scripted = Consumer(broker, exchange)
    thread = threading.Thread(target=scripted.proxy.start, daemon=True)
    thread.start()
    assert scripted.proxy.wait(WAIT)
    try:
        yield scripted
    finally:
        scripted.proxy.stop()
        thread.join(WAIT)
        delete_exchange(broker.url, exchange, [f"{exchange}_{TOPIC}"])


def protocol_sent(broker: Broker, exchange: str, consumer: Consumer, **options: Any) -> object:
    """The protocol an engine with ``options`` puts on a request it sends over ``broker``."""
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, [TOPIC], url=broker.url,
                                  **options)
    executor.start()
    try:
        assert executor.wait_for_workers(1, timeout=WAIT) == 0
        future = executor.execute_task(Short(), uuid.uuid4().hex, {})
        assert future.result(timeout=WAIT) == (EXECUTED, "done")
        return consumer.protocols.get(timeout=WAIT)
    finally:
        executor.stop()


def test_a_default_engine_lets_short_tasks_start_quietly_only_on_rabbitmq(
        broker: Broker, exchange: str, consumer: Consumer) -> None:
    expected = pr.QUIET_START_PROTOCOL if broker.name == "rabbitmq" else 1
    assert protocol_sent(broker, exchange, consumer) == expected


@pytest.mark.parametrize("quiet_start", [True, False])
def test_the_option_decides_on_every_broker(broker: Broker, exchange: str, consumer: Consumer,
                                            quiet_start: bool) -> None:
    expected = pr.QUIET_START_PROTOCOL if quiet_start else 1
    assert protocol_sent(broker, exchange, consumer, quiet_start=quiet_start) == expected
