"""A worker that says it is serving hears control broadcasts sent right after (memory transport).

``Worker.wait()`` returns once the topic queue AND the control queue are consumed: a pause sent
to a fanout exchange before the control queue is bound would be dropped by the broker (the
``wbe_pause.py`` example once waited for such a lost pause under load).
"""

from __future__ import annotations

import threading
import uuid

import pytest
from event_tasks import Add

from flowengine.worker_based.pause import send_pause
from flowengine.worker_based.worker import Worker

WAIT = 30.0


def test_wait_returns_only_once_the_control_queue_is_consumed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    exchange, topic = f"ready-{uuid.uuid4().hex[:8]}", "ready"
    worker = Worker(exchange, topic, [Add], threads_count=1, transport="memory")
    control = worker._server._control_proxy
    assert control is not None
    gate = threading.Event()
    start_control = control.start

    def late_start() -> None:  # the control consumer is slow to come up
        gate.wait(WAIT)
        start_control()

    monkeypatch.setattr(control, "start", late_start)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert worker._server._proxy.wait(WAIT)  # the topic queue is consumed...
        assert not worker.wait(0.2)  # ...but the worker is not ready to hear a pause yet
        gate.set()
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
        gate.set()
        worker.stop(grace=1)
        thread.join(WAIT)
