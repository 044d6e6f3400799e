"""A worker that says it is serving hears control broadcasts sent right after (memory transport).

``Worker.wait()`` returns once the topic queue AND the control queue are consumed: a pause sent
to a fanout exchange before the control queue is bound would be dropped by the broker (the
``wbe_pause.py`` example once waited for such a lost pause under load).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from event_tasks import Add

from flowengine.worker_based import extensions as ext
from flowengine.worker_based.broker import transport_memory
from flowengine.worker_based.pause import send_pause
from flowengine.worker_based.worker import Worker

WAIT = 30.0


class _SlowControl:
    """Which control queue the broker is slow to declare, and whether it has got to it."""

    queue = ""
    declared = threading.Event()


class _SlowControlChannel(transport_memory.Channel):
    def queue_declare(self, queue: str = "", passive: bool = False, **kwargs: Any) -> Any:
        # Held before the declaration (and outside its process-wide lock): the queue is
        # neither declared nor bound, nor consumed, until the test lets it through.
        if queue == _SlowControl.queue:
            assert _SlowControl.declared.wait(WAIT), "the test never let the declaration through"
        return super().queue_declare(queue=queue, passive=passive, **kwargs)


class _SlowControlTransport(transport_memory.Transport):
    """The memory transport, on which the worker's control consumer is slow to come up: the
    one simulated edge."""

    Channel = _SlowControlChannel


class _Online(ext.EventSink):
    """Hears the worker say it is online, which it does once its topic queue is consumed."""

    def __init__(self) -> None:
        self.announced = threading.Event()

    def emit(self, event_type: str, **fields: object) -> None:
        if event_type == "worker-online":
            self.announced.set()


def test_wait_returns_only_once_the_control_queue_is_consumed() -> None:
    exchange, topic = f"ready-{uuid.uuid4().hex[:8]}", "ready"
    online = _Online()
    worker = Worker(exchange, topic, [Add], threads_count=1, transport=_SlowControlTransport,
                    events=online)
    _SlowControl.declared.clear()
    _SlowControl.queue = f"{exchange}_{ext.control_routing_key(worker.worker_id)}"
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert online.announced.wait(WAIT)  # the topic queue is consumed...
        assert not worker.wait(0.2)  # ...but the worker is not ready to hear a pause yet
        _SlowControl.declared.set()
        assert worker.wait(WAIT)
        send_pause(topic, exchange, transport="memory")
        heard = threading.Event()
        for _ in range(int(WAIT * 100)):  # a pause heard shows at once in the worker's state
            if worker.paused:
                heard.set()
                break
            heard.wait(0.01)
        assert heard.is_set(), "the pause sent right after wait() was lost"
    finally:
        _SlowControl.declared.set()
        worker.stop(grace=1)
        thread.join(WAIT)
