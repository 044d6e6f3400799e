"""Suspending with remote work queued: what has not started is dropped, what has is waited for.

Engine side: a scripted worker (kombu's memory transport) answers as the test says, and a
listener bound like a worker's control queue records the CANCEL broadcasts. Worker side: a real
Worker over memory and flowengine's filesystem transport. End to end: an engine suspended while
one remote task runs and two wait behind it on a one-thread worker.
"""

from __future__ import annotations

import functools
import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from wb_lease_tasks import Slow  # tests/unit is on sys.path (pytest rootdir insertion)
from wb_requester import TOPIC, WAIT, Requester, run_in_thread

from flowengine import engines, states, task
from flowengine.engines.executor import EXECUTED
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import worker as wk
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.executor import WorkerTaskExecutor


# ---- the revoked-id set --------------------------------------------------------------------------
def test_revoked_ids_are_taken_once_and_forgotten_after_their_ttl() -> None:
    now = [0.0]
    revoked = cn.Revoked(ttl=10.0, clock=lambda: now[0])
    revoked.add(["a", "b"])
    assert revoked.take("a") and not revoked.take("a")
    now[0] = 11.0
    assert not revoked.take("b"), "past its ttl"
    assert not revoked.take(None) and not revoked.take(["a"]) and not revoked.take("")


def test_revoked_ids_are_bounded_oldest_first() -> None:
    revoked = cn.Revoked(limit=2)
    revoked.add(["a", "b", "c"])
    assert len(revoked) == 2 and not revoked.take("a") and revoked.take("c")


def test_a_cancel_body_is_validated() -> None:
    cn.Cancel.validate(cn.Cancel(["r1"]).to_dict())
    for bad in ({}, {"request_ids": []}, {"request_ids": [1]}, {"request_ids": ["x"], "y": 1}):
        with pytest.raises(Exception, match="Cancel message data"):
            cn.Cancel.validate(bad)


# ---- engine side ---------------------------------------------------------------------------------
class Scripted:
    """A worker of topic ``scripted`` that replies only when told to, and hears CANCELs."""

    def __init__(self, exchange: str, control: dict[str, dp.Handler] | None = None) -> None:
        self.requests: queue.Queue[Any] = queue.Queue()
        self.cancels: queue.Queue[list[str]] = queue.Queue()
        self.topic = px.Proxy("scripted", exchange, {
            pr.REQUEST: dp.Handler(lambda _data, message: self.requests.put(message)),
            pr.NOTIFY: dp.Handler(self._on_notify)}, transport="memory")
        self.control = px.Proxy(
            ext.control_routing_key("w1"), exchange,
            {cn.CANCEL: dp.Handler(lambda data, _m: self.cancels.put(data["request_ids"]),
                                   cn.Cancel.validate), **(control or {})},
            transport="memory", extra_routing_keys=[ext.DISCOVER_ROUTING_KEY],
            transient_queue=True)  # fmt: skip
        self.threads = [run_in_thread(p.start) for p in (self.topic, self.control)]
        assert self.topic.wait(WAIT) and self.control.wait(WAIT)

    def _on_notify(self, _data: Any, message: Any) -> None:
        self.topic.publish(pr.Notify(topic="scripted", tasks=[pr.task_class_name(Slow())]),
                           message.properties["reply_to"], headers=self.headers)

    headers = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION, pr.HEADER_WORKER: "w1"}

    def reply(self, message: Any, state: str, **data: Any) -> None:
        self.topic.publish(pr.Response(state, **data), message.properties["reply_to"],
                           correlation_id=message.properties["correlation_id"],
                           headers=self.headers)

    def close(self) -> None:
        for proxy, thread in zip((self.topic, self.control), self.threads):
            proxy.stop()
            thread.join(WAIT)


@pytest.fixture
def scripted(exchange: str) -> Iterator[Scripted]:
    worker = Scripted(exchange)
    yield worker
    worker.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def executor(exchange: str, clock: ManualClock) -> Iterator[WorkerTaskExecutor]:
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["scripted"], transport="memory",
                                  clock=clock, transition_timeout=30.0)
    executor.start()
    yield executor
    executor.stop()


def test_cancelling_a_queued_request_asks_workers_to_drop_it_and_ends_when_one_did(
    scripted: Scripted, executor: WorkerTaskExecutor
) -> None:
    future = executor.execute_task(Slow(name="queued"), "atom-1", {})
    message = scripted.requests.get(timeout=WAIT)
    assert not future.cancel(), "it may still be taken: not cancelled until a worker says so"
    assert not future.cancel(), "asking again sends nothing more"
    assert scripted.cancels.get(timeout=WAIT) == [message.properties["correlation_id"]]
    scripted.reply(message, pr.EVENT, event_type=cn.EVENT_CANCELLED, details={"worker": "w1"})
    done: queue.Queue[Any] = queue.Queue()
    future.add_done_callback(done.put)
    assert done.get(timeout=WAIT) is future and future.cancelled()
    assert not executor.attempts()
    assert scripted.cancels.empty()


def test_a_request_that_started_is_waited_for(
    scripted: Scripted, executor: WorkerTaskExecutor
) -> None:
    future = executor.execute_task(Slow(name="started"), "atom-2", {})
    message = scripted.requests.get(timeout=WAIT)
    scripted.reply(message, pr.RUNNING)
    # The RUNNING reply must land before the cancel: wait until the executor saw it.
    assert _eventually(lambda: [a.state for a in executor.attempts()] == [pr.RUNNING])
    assert not future.cancel()
    scripted.reply(message, pr.SUCCESS, result="finished")
    assert future.result(timeout=WAIT) == (EXECUTED, "finished")
    assert scripted.cancels.empty(), "a running request is not revoked"


def test_an_awaited_call_a_worker_stopped_as_asked_is_cancelled_after_its_running_reply(
    scripted: Scripted, executor: WorkerTaskExecutor
) -> None:
    # An async task a worker had started when the CANCEL came: its RUNNING reply crossed the
    # CANCEL, and the worker cancelled the coroutine and said so.
    future = executor.execute_task(Slow(name="awaited"), "atom-4", {})
    message = scripted.requests.get(timeout=WAIT)
    assert not future.cancel()
    assert scripted.cancels.get(timeout=WAIT) == [message.properties["correlation_id"]]
    scripted.reply(message, pr.RUNNING)
    scripted.reply(message, pr.EVENT, event_type=cn.EVENT_CANCELLED, details={"worker": "w1"})
    done: queue.Queue[Any] = queue.Queue()
    future.add_done_callback(done.put)
    assert done.get(timeout=WAIT) is future and future.cancelled()
    assert not executor.attempts()


def test_a_revoked_request_nobody_confirms_is_cancelled_once_it_expires(
    scripted: Scripted, executor: WorkerTaskExecutor, clock: ManualClock
) -> None:
    # Its deadline header voids it on every worker, so it can no longer run anywhere.
    future = executor.execute_task(Slow(name="stuck"), "atom-3", {})
    scripted.requests.get(timeout=WAIT)
    future.cancel()
    scripted.cancels.get(timeout=WAIT)
    clock.now += 31.0
    executor.on_wait()
    assert future.cancelled()


def _eventually(condition: Any) -> bool:
    done = threading.Event()
    for _ in range(1000):
        if condition():
            return True
        done.wait(0.01)
    return condition()


# ---- worker side ---------------------------------------------------------------------------------
RUNS: list[str] = []


class Counted(task.Task):
    def execute(self) -> str:
        RUNS.append(self.name)
        return "ran"


@pytest.fixture
def real_worker(exchange: str, transport: dict[str, Any]) -> Iterator[wk.Worker]:
    RUNS.clear()
    worker = wk.Worker(exchange, TOPIC, [Counted], threads_count=1, **transport)
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    yield worker
    worker.stop(grace=WAIT)
    thread.join(WAIT)


def test_a_worker_drops_a_revoked_request_unrun_and_says_so(
    real_worker: wk.Worker, requester: Requester
) -> None:
    revoked_id = uuid.uuid4().hex
    # The control queue is up once the worker answers a discovery broadcast.
    requester.proxy.publish(pr.Notify(), ext.DISCOVER_ROUTING_KEY,
                            reply_to=requester.reply_key, declare_queue=False)
    requester.notify_reply()
    requester.proxy.publish(cn.Cancel([revoked_id]), ext.DISCOVER_ROUTING_KEY,
                            headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                            declare_queue=False)
    # Sent after the CANCEL, over another queue: retry until the worker has heard of it.
    for _ in range(100):
        request = pr.Request(Counted(name="revoked"), revoked_id, pr.EXECUTE, {})
        requester.proxy.publish(request, TOPIC, reply_to=requester.reply_key,
                                correlation_id=revoked_id)
        body, headers = requester.next(revoked_id)
        if body["state"] == pr.EVENT:
            break
        requester.outcome(request)  # ran before the CANCEL arrived: let it finish
        RUNS.clear()
    assert body == {"state": pr.EVENT, "data": {
        "event_type": cn.EVENT_CANCELLED, "details": {"worker": real_worker.worker_id}}}
    assert headers[pr.HEADER_WORKER] == real_worker.worker_id
    assert RUNS == []
    fresh = requester.send(Counted(name="fresh"))
    assert requester.outcome(fresh)[-1] == {"state": pr.SUCCESS, "data": {"result": "ran"}}
    assert RUNS == ["fresh"]


# ---- end to end ----------------------------------------------------------------------------------
GATE = threading.Event()
STARTED = threading.Event()


class Blocker(task.Task):
    """Blocks until the gate opens: on a one-thread worker, whichever starts first holds the
    thread and the others wait in the queue."""

    def execute(self) -> str:
        RUNS.append(self.name)
        STARTED.set()
        assert GATE.wait(WAIT), "the test never opened the gate"
        return "blocked"


def test_suspending_drops_queued_remote_work_and_waits_for_running_work(
    exchange: str, transport: dict[str, Any]
) -> None:
    RUNS.clear()
    GATE.clear()
    STARTED.clear()
    worker = wk.Worker(exchange, TOPIC, [Blocker], threads_count=1, **transport)
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    try:
        flow = uf.Flow("f").add(Blocker("a"), Blocker("b"), Blocker("c"))
        engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                              transition_timeout=WAIT, **transport)
        done = threading.Event()
        runner = run_in_thread(lambda: (engine.run(), done.set()))
        assert STARTED.wait(WAIT)
        engine.suspend()
        # The two queued requests are revoked once the worker heard both CANCELs; only then
        # may the running one finish and free the thread for the next.
        assert _eventually(lambda: worker.stats().revoked >= 2)
        GATE.set()
        runner.join(WAIT)
        assert done.is_set(), "run() should return once suspended"
        assert engine.storage.get_flow_state() == states.SUSPENDED
        [first] = RUNS  # the queued two must not run after the suspension
        assert engine.storage.get_atom_state(first) == states.SUCCESS
        engine.run()
        assert engine.storage.get_flow_state() == states.SUCCESS
        assert sorted(RUNS) == ["a", "b", "c"], "each ran exactly once"
    finally:
        GATE.set()
        worker.stop(grace=WAIT)
        thread.join(WAIT)
