"""A consumer tells when it last found its queue empty, and can be waited on for that.

A worker starts a request only once its control consumer has read its queue to the end lately
(a CANCEL may wait there after a freeze: ``server._catch_up_on_control``). Over kombu's memory
transport, a handler held on a gate stands in for a consumer that lags.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px

#: Seconds a test waits for something another thread does.
WAIT = 10.0


class Lagging:
    """A consumer of topic ``control`` whose handler waits on :attr:`gate` for each message."""

    def __init__(self) -> None:
        self.exchange = f"idle-{uuid.uuid4().hex[:10]}"
        self.gate = threading.Event()
        self.handled: list[str] = []
        self.proxy = px.Proxy("control", self.exchange, {pr.NOTIFY: dp.Handler(self._on)},
                              transport="memory")
        self.thread = threading.Thread(target=self.proxy.start, daemon=True)

    def _on(self, data: Any, _message: Any) -> None:
        assert self.gate.wait(WAIT)
        self.handled.append(data["topic"])

    def send(self, n: int) -> None:
        for i in range(n):
            self.proxy.publish(pr.Notify(topic=f"t{i}", tasks=[]), "control")


@pytest.fixture
def lagging() -> Iterator[Lagging]:
    made = Lagging()
    made.thread.start()
    assert made.proxy.wait(WAIT)
    try:
        yield made
    finally:
        made.gate.set()
        made.proxy.stop()
        made.thread.join(WAIT)


def test_an_idle_consumer_says_when_it_last_found_its_queue_empty(lagging: Lagging) -> None:
    before = time.monotonic()
    assert lagging.proxy.wait_idle_after(before, WAIT)
    assert lagging.proxy.idle_at > before


def test_waiting_for_an_idle_drain_returns_once_what_was_queued_is_handled(
        lagging: Lagging) -> None:
    lagging.send(3)
    asked = time.monotonic()
    # Held on the first message: the consumer finds nothing empty, so the wait times out.
    assert not lagging.proxy.wait_idle_after(asked, 0.2)
    lagging.gate.set()
    assert lagging.proxy.wait_idle_after(asked, WAIT)
    assert lagging.handled == ["t0", "t1", "t2"]
