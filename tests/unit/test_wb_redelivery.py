"""A worker given a request the broker redelivered hands it back to a flowengine engine unrun.

The test takes the queued request and gives it back unsettled, as a worker that dies or loses
its connection holding it does; the broker then redelivers it, marked ``redelivered``, to a real
Worker. Over kombu's memory transport and flowengine's filesystem one.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from wb_requester import TOPIC, WAIT, Requester, run_in_thread  # tests/unit is on sys.path

from flowengine import task
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import worker as wk
from flowengine.worker_based.broker import proxy as px

RUNS: list[str] = []


class Counted(task.Task):
    def execute(self) -> str:
        RUNS.append(self.name)
        return "ran"


def deliver_and_give_back(exchange: str, transport: dict[str, Any]) -> None:
    """Take the queued request and give it back unsettled, as a worker that dies holding it
    does: the broker then marks it redelivered."""
    holder = px.Proxy(TOPIC, exchange, **transport)
    try:
        assert len(holder.browse(TOPIC)) == 1
    finally:
        holder.close()


@pytest.fixture
def start_worker(exchange: str, transport: dict[str, Any]) -> Iterator[Any]:
    RUNS.clear()
    started: list[tuple[wk.Worker, threading.Thread]] = []

    def start() -> wk.Worker:
        worker = wk.Worker(exchange, TOPIC, [Counted], threads_count=2, **transport)
        thread = run_in_thread(functools.partial(worker.run, display_banner=False))
        assert worker.wait(WAIT)
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.stop(grace=WAIT)
        thread.join(WAIT)


def test_a_redelivered_request_from_a_flowengine_engine_is_handed_back_unrun(
    exchange: str, transport: dict[str, Any], requester: Requester, start_worker: Any
) -> None:
    headers = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION}
    risky = requester.send(Counted(name="risky"), headers=headers)
    deliver_and_give_back(exchange, transport)
    worker = start_worker()
    body, reply_headers = requester.next(risky.uuid)
    assert body == {"state": pr.EVENT, "data": {
        "event_type": ext.EVENT_REDELIVERED, "details": {"worker": worker.worker_id}}}
    assert reply_headers[pr.HEADER_WORKER] == worker.worker_id
    # The worker keeps serving; the request it handed back was settled, not put back.
    fresh = requester.send(Counted(name="fresh"), headers=headers)
    assert requester.outcome(fresh)[-1] == {"state": pr.SUCCESS, "data": {"result": "ran"}}
    assert RUNS == ["fresh"]
    assert requester.replies[risky.uuid].empty()


def test_a_redelivered_request_from_a_taskflow_engine_still_runs(
    exchange: str, transport: dict[str, Any], requester: Requester, start_worker: Any
) -> None:
    # A TaskFlow engine counts no attempts and would not understand the hand-back.
    legacy = requester.send(Counted(name="legacy"))
    deliver_and_give_back(exchange, transport)
    start_worker()
    assert requester.outcome(legacy)[-1] == {"state": pr.SUCCESS, "data": {"result": "ran"}}
    assert RUNS == ["legacy"]
