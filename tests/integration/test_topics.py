"""``flowengine topics`` on a real beanstalkd (every count) and on Redis (what it can tell).

The queues are filled with kombu directly: requests ready, one delayed, one held by a consumer
that never settles it (running), and a dead letter; the command's JSON is compared with that.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import event_tasks
import kombu
import pytest
from click.testing import CliRunner
from wbe_harness import Broker, delete_exchange

from flowengine.cli.main import cli
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.broker import transport_beanstalk as tb
from flowengine.worker_based.worker import Worker

pytestmark = pytest.mark.integration


@pytest.fixture
def exchange(beanstalk_url: str) -> Iterator[kombu.Exchange]:
    made = kombu.Exchange(f"topics-{uuid.uuid4().hex[:10]}", type="direct")
    try:
        yield made
    finally:
        with kombu.Connection(beanstalk_url) as conn, conn.channel() as channel:
            for key in ("a", "b", str(uuid.UUID(int=0)), uuid.UUID(int=1).hex,
                        ext.DEAD_LETTER_ROUTING_KEY):
                channel.queue_delete(f"{made.name}_{key}")
            channel.exchange_delete(made.name)


def _topics(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = CliRunner().invoke(cli, ["topics", "--json", *args])
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, rows, result.output


def _queue(exchange: kombu.Exchange, key: str) -> kombu.Queue:
    return kombu.Queue(f"{exchange.name}_{key}", exchange, routing_key=key)


def test_topics_on_beanstalkd_count_every_state(
    beanstalk_url: str, exchange: kombu.Exchange,
) -> None:  # fmt: skip
    with kombu.Connection(beanstalk_url) as conn, kombu.Connection(beanstalk_url) as holder:
        producer = kombu.Producer(conn.channel(), exchange)
        keys = ["a", "b", str(uuid.UUID(int=0)), uuid.UUID(int=1).hex,
                ext.DEAD_LETTER_ROUTING_KEY]
        declared = {key: _queue(exchange, key) for key in keys}
        for key, body, headers in [
            ("a", 1, {}), ("a", 2, {}), ("a", 3, {tb.HEADER_DELAY: 60}), ("b", 4, {}),
            (keys[2], "a reply", {}),  # an engine's reply queue: not a topic
            (keys[3], "a reply", {}),  # the process-wide client's (no dashes): not either
            (ext.DEAD_LETTER_ROUTING_KEY, {"task_name": "t", "task_cls": "m.T",
                                           "action": "execute"},
             {ext.HEADER_DEAD_TOPIC: "a", ext.HEADER_DEAD_REASON: "lost"}),
        ]:
            producer.publish(body, routing_key=key, headers=headers,
                             declare=[declared[key]], serializer="json")
        held = declared["b"](holder.channel()).get(no_ack=False)  # running, never settled
        assert held is not None

        code, rows, output = _topics("--url", beanstalk_url, "--exchange", exchange.name)
        assert code == 0, output
        assert rows == [
            {"topic": "a", "ready": 2, "running": 0, "delayed": 1, "dead": 1, "workers": 0},
            {"topic": "b", "ready": 0, "running": 1, "delayed": 0, "dead": 0, "workers": 1},
        ]
        text = CliRunner().invoke(cli, ["topics", "--url", beanstalk_url, "--exchange",
                                        exchange.name]).output.splitlines()
        assert text[0].split() == ["TOPIC", "READY", "RUNNING", "DELAYED", "DEAD", "WORKERS"]
        assert text[1].split() == ["a", "2", "0", "1", "1", "0"]


def test_topics_on_redis_list_the_topics_and_tell_ready_counts(redis_broker: Broker) -> None:
    exchange = kombu.Exchange(f"topics-{uuid.uuid4().hex[:10]}", type="direct")
    try:
        with kombu.Connection(redis_broker.url) as conn:
            kombu.Producer(conn.channel(), exchange).publish(
                {"n": 1}, routing_key="a", declare=[_queue(exchange, "a")], serializer="json")
        # Listed from the exchanges' binding sets: reply queues are not topics.
        code, rows, output = _topics("--url", redis_broker.url, "--exchange", exchange.name)
        assert code == 0, output
        assert [row["topic"] for row in rows] == ["a"]
        code, rows, output = _topics("--url", redis_broker.url, "--exchange", exchange.name,
                                     "a", "never-used")
        assert code == 0, output
        assert rows == [
            {"topic": "a", "ready": 1, "running": None, "delayed": None, "dead": 0,
             "workers": 0},
            {"topic": "never-used", "ready": 0, "running": None, "delayed": None, "dead": 0,
             "workers": 0},
        ]
    finally:
        delete_exchange(redis_broker.url, exchange.name)


def test_topics_count_the_live_workers_where_the_broker_cannot(redis_broker: Broker) -> None:
    exchange = f"topics-{uuid.uuid4().hex[:10]}"
    worker = Worker(exchange, "served", [event_tasks], url=redis_broker.url, threads_count=1)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert worker.wait(30)
        code, rows, output = _topics("--url", redis_broker.url, "--exchange", exchange,
                                     "served", "idle")
        assert code == 0, output
        assert [(row["topic"], row["workers"]) for row in rows] == [("idle", 0), ("served", 1)]
    finally:
        worker.stop(grace=5.0)
        thread.join(30)
        delete_exchange(redis_broker.url, exchange)
