"""One message each way for short tasks (issue 33), on a real worker over kombu's memory broker.

An engine of flowengine protocol 2 takes a short task's outcome as its only reply: the worker
says RUNNING only once the task outlives a short threshold (``extensions.RUNNING_AFTER``, moved
here to make "short" and "long" certain), never later than its first heartbeat, and at once
for a task it has not seen end within the threshold last time. TaskFlow
engines, engines of protocol 1 and workers in TaskFlow-compatibility mode keep RUNNING first.
A worker that gives such a request back to the broker unstarted says so first.
"""

from __future__ import annotations

import concurrent.futures as cf
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

GATE = threading.Event()
QUIET = {pr.HEADER_PROTOCOL: pr.QUIET_START_PROTOCOL}


class Held(task.Task):
    """Runs until the test opens the gate."""

    def execute(self) -> str:
        assert GATE.wait(WAIT), "never let through"
        return "done"


@pytest.fixture
def transport() -> dict[str, Any]:
    # The memory broker only (conftest's exchange and requester use it).
    return {"transport": "memory"}


def _serve(exchange: str, transport: dict[str, Any],
           **options: Any) -> Iterator[wk.Worker]:
    GATE.clear()
    worker = wk.Worker(exchange, TOPIC, [Held], threads_count=2, **transport, **options)
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    yield worker
    GATE.set()
    worker.stop(grace=WAIT)
    thread.join(WAIT)


@pytest.fixture
def worker(exchange: str, transport: dict[str, Any]) -> Iterator[wk.Worker]:
    yield from _serve(exchange, transport)


def states(requester: Requester, request: pr.Request) -> list[str]:
    return [body["state"] for body in requester.outcome(request)]


def _seen_short(requester: Requester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run Held once, short: the worker says RUNNING first (it has not seen Held end short),
    and notes it ends short."""
    monkeypatch.setattr(ext, "RUNNING_AFTER", WAIT * 3)  # nothing here outlives it
    GATE.set()
    assert states(requester, requester.send(Held(name="first"), headers=QUIET)) == [
        pr.RUNNING, pr.SUCCESS]
    GATE.clear()


def test_a_short_task_of_a_protocol_2_engine_sends_its_outcome_alone(
    worker: wk.Worker, requester: Requester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _seen_short(requester, monkeypatch)
    GATE.set()
    assert states(requester, requester.send(Held(name="short"), headers=QUIET)) == [pr.SUCCESS]


def test_a_task_whose_last_run_was_long_says_running_at_once_again(
    worker: wk.Worker, requester: Requester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _seen_short(requester, monkeypatch)
    monkeypatch.setattr(ext, "RUNNING_AFTER", 0.01)
    request = requester.send(Held(name="long"), headers=QUIET)
    assert requester.next(request.uuid)[0]["state"] == pr.RUNNING  # from the heartbeat thread
    GATE.set()
    assert states(requester, request) == [pr.SUCCESS]
    # Seen long now: a worker that froze at its start must have said RUNNING, so it says so
    # before the task runs (here the gate is shut: the task cannot have run yet).
    GATE.clear()
    monkeypatch.setattr(ext, "RUNNING_AFTER", WAIT * 3)
    request = requester.send(Held(name="again"), headers=QUIET)
    assert requester.next(request.uuid)[0]["state"] == pr.RUNNING
    GATE.set()
    assert states(requester, request) == [pr.SUCCESS]


def test_a_task_that_outlives_the_threshold_says_running_before_its_outcome(
    worker: wk.Worker, requester: Requester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _seen_short(requester, monkeypatch)
    monkeypatch.setattr(ext, "RUNNING_AFTER", 0.01)
    request = requester.send(Held(name="long"), headers=QUIET)
    body, headers = requester.next(request.uuid)  # while the task is still held
    assert body == {"state": pr.RUNNING, "data": {}}
    assert headers[pr.HEADER_WORKER] == worker.worker_id
    GATE.set()
    assert states(requester, request) == [pr.SUCCESS]


def test_running_comes_no_later_than_the_first_heartbeat_and_heartbeats_follow(
    worker: wk.Worker, requester: Requester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _seen_short(requester, monkeypatch)
    request = requester.send(Held(name="beating"),
                             headers={**QUIET, ext.HEADER_HEARTBEAT: 0.01})
    assert requester.next(request.uuid)[0]["state"] == pr.RUNNING
    assert requester.next(request.uuid)[0]["data"]["event_type"] == ext.EVENT_HEARTBEAT
    GATE.set()


@pytest.mark.parametrize("headers", [{}, {pr.HEADER_PROTOCOL: 1}],
                         ids=["taskflow-engine", "protocol-1-engine"])
def test_older_engines_still_get_running_first(
    worker: wk.Worker, requester: Requester, headers: dict[str, Any],
) -> None:
    GATE.set()
    assert states(requester, requester.send(Held(name="told"), headers=headers)) == [
        pr.RUNNING, pr.SUCCESS]


def test_a_worker_in_taskflow_compatibility_mode_still_says_running_first(
    exchange: str, transport: dict[str, Any],
) -> None:
    compat = {**transport, "taskflow_compat": True}  # TaskFlow's declarations, on both ends
    requester = Requester(exchange, compat)
    serving = _serve(exchange, compat)
    try:
        next(serving)
        GATE.set()
        assert states(requester, requester.send(Held(name="compat"), headers=QUIET)) == [
            pr.RUNNING, pr.SUCCESS]
    finally:
        next(serving, None)
        requester.close()


def test_a_request_given_back_unstarted_is_announced_as_returned(
    exchange: str, transport: dict[str, Any], requester: Requester,
) -> None:
    pool = cf.ThreadPoolExecutor(1)
    pool.shutdown()  # the worker can run nothing: it gives every request back
    stopped = wk.Worker(exchange, TOPIC, [Held], executor=pool, threads_count=1, **transport)
    thread = run_in_thread(functools.partial(stopped.run, display_banner=False))
    try:
        assert stopped.wait(WAIT)
        request = requester.send(Held(name="back"), headers=QUIET)
        body, headers = requester.next(request.uuid)
        assert body["data"] == {"event_type": ext.EVENT_RETURNED,
                                "details": {"worker": stopped.worker_id}}
    finally:
        stopped.stop()
        thread.join(WAIT)
