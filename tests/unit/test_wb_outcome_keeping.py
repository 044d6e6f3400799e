"""A worker acknowledges a request only once its outcome is published (at-least-once).

A real worker and the hand-driven engine side share kombu's memory transport, whose channel
refuses every reply to the engine's queue while the test says so, as a broker that cannot take
them does: the one edge that is simulated. The worker gives up on the outcome after its
(shortened) publish deadline; the request must then go back to the broker, be run again, and be
acknowledged once an outcome gets through (RUNNING and events pass).
"""

from __future__ import annotations

import base64
import functools
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.exceptions import ConnectionError as KombuConnectionError
from kombu.transport import memory
from wb_requester import TOPIC, WAIT, Requester, run_in_thread

from flowengine import task
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import worker as wk
from flowengine.worker_based.worker_side import replies


class _Replies:
    """Whether the broker refuses outcomes sent to the engine's queue, and which queue that is."""

    refused_queue: str | None = None


def _is_outcome(message: dict[str, Any]) -> bool:
    body = message.get("body", "")
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body).decode()
    return json.loads(body).get("state") in (pr.SUCCESS, pr.FAILURE)


class RefusingChannel(memory.Channel):
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        if queue == _Replies.refused_queue and _is_outcome(message):
            raise KombuConnectionError("the broker refuses the outcome (the test)")
        super()._put(queue, message, **kwargs)


class RefusingTransport(memory.Transport):
    Channel = RefusingChannel


RUNS: list[str] = []
RAN_TWICE = threading.Event()


class Counts(task.Task):
    """Counts its runs; the second one tells the test."""

    def execute(self) -> str:
        RUNS.append(self.name)
        if len(RUNS) >= 2:
            RAN_TWICE.set()
        return "done"


@pytest.fixture
def requester(exchange: str) -> Iterator[Requester]:
    made = Requester(exchange, {"transport": RefusingTransport})
    yield made
    _Replies.refused_queue = None
    made.close()


def test_a_request_whose_outcome_cannot_be_published_is_run_again_not_dropped(
        exchange: str, requester: Requester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replies, "OUTCOME_PUBLISH_DEADLINE", 0.3)
    RUNS.clear()
    RAN_TWICE.clear()
    worker = wk.Worker(exchange, TOPIC, [Counts], threads_count=1, events=False,
                       transport=RefusingTransport, retry_options={"interval_start": 0.0})
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    try:
        assert worker.wait(WAIT)
        _Replies.refused_queue = f"{exchange}_{requester.reply_key}"
        request = requester.send(Counts(name=f"counted-{uuid.uuid4().hex[:6]}"))
        # Its outcome could not be published: acknowledging it would lose the work's only
        # record, so the broker must have it again, and the worker runs it again.
        assert RAN_TWICE.wait(WAIT), f"ran {len(RUNS)} time(s): the request was dropped"
        _Replies.refused_queue = None
        assert requester.outcome(request)[-1] == {"state": pr.SUCCESS,
                                                  "data": {"result": "done"}}
    finally:
        _Replies.refused_queue = None
        worker.stop(grace=WAIT)
        thread.join(WAIT)
