"""Message priority orders delivery on every transport: memory, flowengine-fs, Redis, RabbitMQ
and beanstalkd (real servers for the last three).

Nothing consumes while the messages are published, lowest priority first; a consumer that
comes afterwards must take them highest priority first, and in send order within a level.
flowengine's :class:`~flowengine.worker_based.broker.proxy.Proxy` publishes (so its rule for which
transports carry a priority is tested too) and reads the queue back with ``browse``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from wbe_harness import TRANSPORTS, require_broker

from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import proxy as px

pytestmark = pytest.mark.integration

#: One priority per level every broker keeps apart (Redis keeps four by default:
#: 7-9, 4-6, 1-3 and 0, see doc/priorities.rst), sent lowest first; two share the top level
#: and one has no priority, to check send order within a level.
SENT: list[tuple[str, int | None]] = [
    ("zero", 0), ("none", None), ("two", 2), ("five", 5), ("nine-a", 9), ("nine-b", 9),
]
SERVED = ["nine-a", "nine-b", "five", "two", "zero", "none"]


@pytest.fixture(params=sorted(TRANSPORTS))
def proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[px.Proxy]:
    where = TRANSPORTS[request.param](tmp_path)
    made = px.Proxy("work", f"prio-{uuid.uuid4().hex[:10]}", {}, **where)
    try:
        yield made
    finally:
        made.delete_own_queue()
        made.close()


def test_a_later_consumer_takes_the_highest_priority_first(proxy: px.Proxy) -> None:
    for name, priority in SENT:
        proxy.publish(pr.Notify(topic=name, tasks=[]), "work", priority=priority)
    served = [message.json()["topic"] for message in proxy.browse("work")]
    assert served == SERVED


def test_redis_with_ten_priority_steps_keeps_every_level_apart() -> None:
    # Levels 1 and 2 share kombu's default step; with a step per priority they do not.
    made = px.Proxy("work", f"prio-{uuid.uuid4().hex[:10]}", {}, url=require_broker("redis").url,
                    transport_options={"priority_steps": list(range(10))})
    try:
        for name, priority in (("one", 1), ("two", 2), ("zero", 0)):
            made.publish(pr.Notify(topic=name, tasks=[]), "work", priority=priority)
        assert [m.json()["topic"] for m in made.browse("work")] == ["two", "one", "zero"]
    finally:
        made.delete_own_queue()
        made.close()


def test_taskflow_compat_sends_no_priority(tmp_path: Path) -> None:
    # TaskFlow's declarations carry no x-max-priority, and its peers expect none.
    made = px.Proxy("work", f"prio-{uuid.uuid4().hex[:10]}", {}, taskflow_compat=True,
                    **TRANSPORTS["flowengine-fs"](tmp_path))
    try:
        made.publish(pr.Notify(topic="urgent", tasks=[]), "work", priority=9)
        [message] = made.browse("work")
        assert "priority" not in message.properties or not message.properties["priority"]
    finally:
        made.close()
