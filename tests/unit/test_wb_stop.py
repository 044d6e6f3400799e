"""Stopping the remote executes of a cancelled flow (engine side): a STOP to the worker holding
each, again with every heartbeat until its outcome; a request not yet running is dropped by the
worker that gets it; a lost one is not sent again. A scripted worker (kombu's memory transport)
answers as the test says and records the STOPs its control queue hears."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from test_wb_cancel import Scripted, _eventually
from wb_lease_tasks import Slow  # tests/unit is on sys.path (pytest rootdir insertion)
from wb_requester import WAIT

from flowengine import exceptions as exc
from flowengine.engines.executor import EXECUTED
from flowengine.types.failure import Failure
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import running_calls as rn
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.executor import WorkerTaskExecutor


class Stoppable(Scripted):
    """A scripted worker whose control queue also records STOPs."""

    def __init__(self, exchange: str) -> None:
        self.stops: queue.Queue[dict[str, Any]] = queue.Queue()
        super().__init__(exchange, {rn.STOP: dp.Handler(lambda data, _m: self.stops.put(data),
                                                        rn.Stop.validate)})

    def heartbeat(self, message: Any) -> None:
        self.reply(message, pr.EVENT, event_type=ext.EVENT_HEARTBEAT, details={})


@pytest.fixture
def worker(exchange: str) -> Iterator[Stoppable]:
    made = Stoppable(exchange)
    yield made
    made.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def executor(exchange: str, clock: ManualClock) -> Iterator[WorkerTaskExecutor]:
    made = WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["scripted"], transport="memory",
                              clock=clock, transition_timeout=30.0, lease_timeout=5.0,
                              heartbeat_interval=1.0, max_attempts=3)
    made.start()
    yield made
    made.stop()


def _running(worker: Stoppable, executor: WorkerTaskExecutor, name: str) -> tuple[Any, Any]:
    future = executor.execute_task(Slow(name=name), f"atom-{name}", {})
    message = worker.requests.get(timeout=WAIT)
    worker.reply(message, pr.RUNNING)
    assert _eventually(lambda: [a.state for a in executor.attempts()] == [pr.RUNNING]), \
        "no RUNNING reply seen"
    return future, message


def test_a_running_execute_is_told_to_stop_again_with_each_heartbeat(
        worker: Stoppable, executor: WorkerTaskExecutor) -> None:
    future, message = _running(worker, executor, "busy")
    request_id = message.properties["correlation_id"]
    executor.stop_executions("customer withdrew")
    assert worker.stops.get(timeout=WAIT) == {"request_ids": [request_id],
                                              "reason": "customer withdrew"}
    for _ in range(2):  # a STOP lost (or early) is made up for by the next heartbeat's
        worker.heartbeat(message)
        assert worker.stops.get(timeout=WAIT)["request_ids"] == [request_id]
    worker.reply(message, pr.SUCCESS, result="stopped early")
    assert future.result(timeout=WAIT) == (EXECUTED, "stopped early")
    worker.heartbeat(message)  # trailing: its request is finished
    with pytest.raises(queue.Empty):
        worker.stops.get(timeout=0.2)
    assert worker.cancels.empty(), "a running request is stopped, never revoked"


def test_an_execute_not_running_yet_is_dropped_by_the_worker_that_gets_it(
        worker: Stoppable, executor: WorkerTaskExecutor) -> None:
    future = executor.execute_task(Slow(name="queued"), "atom-queued", {})
    message = worker.requests.get(timeout=WAIT)
    executor.stop_executions("deadline")
    assert worker.stops.get(timeout=WAIT)["request_ids"] == [
        message.properties["correlation_id"]]
    assert not future.cancel()  # the engine's own cancel sends no CANCEL on top
    worker.reply(message, pr.EVENT, event_type=cn.EVENT_CANCELLED, details={"worker": "w1"})
    done: queue.Queue[Any] = queue.Queue()
    future.add_done_callback(done.put)
    assert done.get(timeout=WAIT) is future and future.cancelled()
    assert worker.cancels.empty()


def test_an_execute_whose_worker_is_lost_while_stopping_fails_and_is_not_sent_again(
        worker: Stoppable, executor: WorkerTaskExecutor, clock: ManualClock) -> None:
    future, _message = _running(worker, executor, "lost")
    executor.stop_executions("stop")
    worker.stops.get(timeout=WAIT)
    clock.advance(6.0)  # past its lease, with no heartbeat
    executor.on_wait()
    outcome, result = future.result(timeout=WAIT)
    assert isinstance(result, Failure) and result.check(exc.WorkerLost)
    with pytest.raises(queue.Empty):
        worker.requests.get(timeout=0.2)  # no second attempt
