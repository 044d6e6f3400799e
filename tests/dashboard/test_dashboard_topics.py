"""Per-topic queue depth on the workers page, as far as the broker tells it."""

from __future__ import annotations

import uuid
import warnings

import dashboard_flows as df
import kombu
import pytest

from flowengine.dashboard import ActionRefused, DashboardData, EventHub, create_app
from flowengine.dashboard.interface import TOPICS_TTL
from flowengine.persistence import base
from flowengine.worker_based import protocol
from flowengine.worker_based.broker import proxy

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's note about httpx's successor
    from starlette.testclient import TestClient


def heard(hub: EventHub, worker: str, topic: str) -> None:
    hub.publish({"type": "worker-heartbeat", "worker": worker, "topic": topic,
                 "timestamp": 1.0, "tasks": ["x.Y"], "capacity": 1, "free": 1,
                 "in_flight": 0, "hostname": "h", "pid": 1})


def test_topics_heard_from_workers_show_what_waits(store: base.Backend) -> None:
    broker = {"exchange": f"dash-{uuid.uuid4().hex[:8]}", "transport": "memory"}
    hub = EventHub(None)
    now = [100.0]
    data = DashboardData(store, hub, broker, clock=lambda: now[0])
    # The memory transport cannot list its queues: the topics come from the workers heard.
    assert data.topics() == []
    heard(hub, "w1", "red")
    heard(hub, "w2", "blue")
    sender = proxy.Proxy("sender", broker["exchange"], transport="memory")
    try:
        for name in ("a", "b"):
            request = protocol.Request(df.Provision(name), uuid.uuid4().hex, protocol.EXECUTE,
                                       {})
            sender.publish(request, "red", reply_to="nobody")
    finally:
        sender.close()
    assert data.topics() == []  # read again only after TOPICS_TTL
    now[0] += TOPICS_TTL
    rows = {row["topic"]: row for row in data.topics()}
    assert (rows["red"]["ready"], rows["blue"]["ready"], rows["red"]["dead"]) == (2, 0, 0)
    with TestClient(create_app(data)) as app:  # type: ignore[arg-type]
        page = app.get("/workers").text
    assert '<tr data-topic="red">' in page and '<td class="ready">2</td>' in page


def test_without_a_broker_there_is_no_topic_table(store: base.Backend) -> None:
    data = DashboardData(store, EventHub(None))
    with pytest.raises(ActionRefused, match="no broker"):
        data.topics()
    with TestClient(create_app(data)) as app:  # type: ignore[arg-type]
        assert 'id="topics"' not in app.get("/workers").text


def test_a_broker_that_is_away_is_named_on_the_workers_page(store: base.Backend) -> None:
    password = "hunter-" + "2" * 8
    broker = {"exchange": "dash", "url": f"amqp://guest:{password}@127.0.0.1:1//",
              "transport_options": {"max_retries": 0}}
    with TestClient(create_app(DashboardData(store, EventHub(None), broker))  # type: ignore[arg-type]
                    ) as app:
        page = app.get("/workers").text
    assert "cannot read the topics" in page and password not in page


@pytest.mark.integration
def test_beanstalkd_tells_every_topic_of_the_exchange(store: base.Backend,
                                                      beanstalk_url: str) -> None:
    exchange = kombu.Exchange(f"dash-topics-{uuid.uuid4().hex[:10]}", type="direct")
    queue = kombu.Queue(f"{exchange.name}_red", exchange, routing_key="red")
    broker = {"exchange": exchange.name, "url": beanstalk_url, "transport": None,
              "transport_options": {}}
    try:
        with kombu.Connection(beanstalk_url) as conn:
            producer = kombu.Producer(conn.channel(), exchange)
            for body in (1, 2):
                producer.publish(body, routing_key="red", declare=[queue])
        # No worker heard from: beanstalkd lists the exchange's tubes itself.
        with TestClient(create_app(DashboardData(store, EventHub(None), broker))  # type: ignore[arg-type]
                        ) as app:
            page = app.get("/workers").text
        row = page[page.index('<tr data-topic="red">'):].split("</tr>", 1)[0]
        assert ('<td class="ready">2</td>' in row and '<td class="running">0</td>' in row
                and '<td class="workers">0</td>' in row)
    finally:
        with kombu.Connection(beanstalk_url) as conn, conn.channel() as channel:
            channel.queue_delete(queue.name)
