"""A worker awaits ``async def`` tasks on one event loop: many at once, cancellable, time-limited.

Real workers over kombu's memory transport and flowengine's filesystem one; the engine side is a
real worker-based engine or the hand-driven :class:`~wb_requester.Requester`.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from behaviour.async_tasks import Gate, gates  # tests/ is on sys.path (rootdir conftest)
from wb_requester import TOPIC, WAIT, Requester, run_in_thread

from flowengine import engines, states, task
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import worker as wk
from flowengine.worker_based.worker_side import async_runner as ar

CANCELLED: list[str] = []
RUNS: list[str] = []
OPEN = threading.Event()
STARTED = threading.Event()


class Counted(task.Task):
    """Counts how many of its kind are awaited at once."""

    running = 0
    peak = 0

    async def execute(self) -> None:
        cls = type(self)
        cls.running += 1
        cls.peak = max(cls.peak, cls.running)
        await asyncio.sleep(0.02)
        cls.running -= 1


class Waits(task.Task):
    """Awaits until the test opens the gate (or ``seconds`` pass); records a cancellation."""

    async def execute(self, seconds: float = WAIT) -> str:
        RUNS.append(self.name)
        STARTED.set()
        try:
            await asyncio.wait_for(asyncio.to_thread(OPEN.wait, seconds), seconds + 1)
        except asyncio.CancelledError:
            CANCELLED.append(self.name)
            raise
        return self.name


class Swallows(task.Task):
    """Catches the cancel its time limit sends and returns a result anyway."""

    async def execute(self) -> str:
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            CANCELLED.append(self.name)
        return "late"


class Reports(task.Task):
    async def execute(self) -> str:
        for value in (0.25, 0.5):
            self.update_progress(value)
            await asyncio.sleep(0)
        return "reported"


class Plain(task.Task):
    def execute(self) -> str:
        return "plain"


def start_worker(exchange: str, transport: dict[str, Any], classes: list[Any],
                 **options: Any) -> tuple[wk.Worker, threading.Thread]:
    worker = wk.Worker(exchange, TOPIC, classes, events=False, **options, **transport)
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    return worker, thread


@pytest.fixture
def async_worker(exchange: str, transport: dict[str, Any]) -> Iterator[wk.Worker]:
    CANCELLED.clear()
    RUNS.clear()
    OPEN.clear()
    STARTED.clear()
    worker, thread = start_worker(exchange, transport, [Waits, Swallows, Reports, Plain],
                                  threads_count=1)
    yield worker
    OPEN.set()
    worker.stop(grace=WAIT)
    thread.join(WAIT)


def test_one_worker_thread_awaits_many_async_tasks_at_once(
        exchange: str, transport: dict[str, Any]) -> None:
    worker, thread = start_worker(exchange, transport, [Gate], threads_count=1)
    try:
        engine = engines.load(gates(40), engine="worker-based", exchange=exchange, topics=[TOPIC],
                              transition_timeout=WAIT, **transport)
        engine.run()
        assert engine.storage.get_flow_state() == states.SUCCESS
    finally:
        worker.stop(grace=WAIT)
        thread.join(WAIT)


def test_async_concurrency_bounds_how_many_are_awaited_at_once(
        exchange: str, transport: dict[str, Any]) -> None:
    Counted.running, Counted.peak = 0, 0
    worker, thread = start_worker(exchange, transport, [Counted], threads_count=1,
                                  async_concurrency=3)
    try:
        flow = uf.Flow("wide").add(*(Counted(f"c{i}") for i in range(12)))
        engines.run(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                    transition_timeout=WAIT, **transport)
        assert Counted.peak == 3
    finally:
        worker.stop(grace=WAIT)
        thread.join(WAIT)


def test_the_capacity_counts_async_slots_only_where_async_tasks_are_served() -> None:
    mixed = wk.Worker("x", TOPIC, [Waits, Plain], threads_count=2, async_concurrency=10,
                      events=False, transport="memory")
    assert mixed.capacity == 12 and mixed.stats().free_slots == 12
    assert "async slots: 10" in mixed.banner
    threads_only = wk.Worker("x", TOPIC, [Plain], threads_count=2, events=False,
                             transport="memory")
    assert threads_only.capacity == 2 and "async slots" not in threads_only.banner
    default = wk.Worker("x", TOPIC, [Waits], threads_count=2, events=False, transport="memory")
    assert default.capacity == 2 + ar.DEFAULT_ASYNC_CONCURRENCY


def test_the_prefetch_adds_the_async_slots_only_while_async_calls_are_awaited(
        async_worker: wk.Worker, requester: Requester) -> None:
    assert async_worker.stats().prefetch == 1, "awaiting nothing: as many as its one thread"
    request = requester.send(Waits(name="held"))
    assert STARTED.wait(WAIT)
    assert async_worker.stats().prefetch == 1 + ar.DEFAULT_ASYNC_CONCURRENCY
    OPEN.set()
    assert requester.outcome(request)[-1]["state"] == pr.SUCCESS
    assert async_worker.stats().prefetch == 1, "the slots close with the last async call"


@pytest.mark.parametrize("value", [0, -1, True, 2.5])
def test_a_bad_async_concurrency_is_refused_by_name(value: Any) -> None:
    with pytest.raises(ValueError, match="'volumes': async_concurrency must be"):
        wk.Worker("x", TOPIC, [Waits], async_concurrency=value, events=False,
                  transport="memory")


def test_a_cancel_stops_a_running_coroutine_and_says_so(
        async_worker: wk.Worker, requester: Requester) -> None:
    # The control queue is up once the worker answers a discovery broadcast.
    requester.proxy.publish(pr.Notify(), ext.DISCOVER_ROUTING_KEY,
                            reply_to=requester.reply_key, declare_queue=False)
    requester.notify_reply()
    request = requester.send(Waits(name="long"), headers={pr.HEADER_PROTOCOL: 1})
    body, _ = requester.next(request.uuid)
    assert body["state"] == pr.RUNNING
    assert STARTED.wait(WAIT)
    requester.proxy.publish(cn.Cancel([request.uuid]), ext.DISCOVER_ROUTING_KEY,
                            headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                            declare_queue=False)
    body, _ = requester.next(request.uuid)
    assert body == {"state": pr.EVENT, "data": {
        "event_type": cn.EVENT_CANCELLED, "details": {"worker": async_worker.worker_id}}}
    assert CANCELLED == ["long"]
    # The worker goes on: a sync and an async request after it both run.
    assert requester.outcome(requester.send(Plain(name="p")))[-1]["data"] == {"result": "plain"}
    OPEN.set()
    assert requester.outcome(requester.send(Waits(name="w")))[-1]["data"] == {"result": "w"}


def test_an_async_task_past_its_time_limit_is_cancelled_and_fails(
        async_worker: wk.Worker, requester: Requester) -> None:
    request = requester.send(Waits(name="slow"), headers={pr.HEADER_TIME_LIMIT: 0.1})
    last = requester.outcome(request)[-1]
    assert last["state"] == pr.FAILURE
    failure = last["data"]["result"]
    assert failure["exc_type_names"][0].endswith(".TaskTimeLimitExceeded"), failure
    assert "'slow' exceeded its time limit of 0.1" in failure["exception_str"]
    assert CANCELLED == ["slow"]


def test_what_a_coroutine_returns_after_its_time_limit_is_not_its_outcome(
        async_worker: wk.Worker, requester: Requester) -> None:
    # It caught the cancel and returned: the limit's failure stands, as on a local engine.
    request = requester.send(Swallows(name="stubborn"), headers={pr.HEADER_TIME_LIMIT: 0.1})
    last = requester.outcome(request)[-1]
    assert last["state"] == pr.FAILURE, last
    failure = last["data"]["result"]
    assert failure["exc_type_names"][0].endswith(".TaskTimeLimitExceeded"), failure
    assert CANCELLED == ["stubborn"]


def test_heartbeats_and_progress_flow_while_a_coroutine_runs(
        async_worker: wk.Worker, requester: Requester) -> None:
    request = requester.send(Waits(name="beating"), arguments={"seconds": 0.3},
                             headers={pr.HEADER_PROTOCOL: 1, ext.HEADER_HEARTBEAT: 0.02})
    bodies = requester.outcome(request)
    beats = [b for b in bodies if b["state"] == pr.EVENT
             and b["data"]["event_type"] == ext.EVENT_HEARTBEAT]
    assert len(beats) >= 2, bodies
    assert bodies[-1] == {"state": pr.SUCCESS, "data": {"result": "beating"}}
    reported = requester.outcome(requester.send(Reports(name="r")))
    progress = [b["data"]["details"]["progress"] for b in reported
                if b["state"] == pr.EVENT]
    assert progress == [0.25, 0.5], "every update, in order, before the outcome"
    assert reported[-1]["data"] == {"result": "reported"}


def test_a_stopping_worker_gives_back_the_coroutines_still_running(
        exchange: str, tmp_path: Path) -> None:
    # The filesystem transport: kombu's memory one does not hand out a closed channel's
    # unsettled messages again.
    transport = {"transport_options": {"data_folder": str(tmp_path / "fs")}}
    requester = Requester(exchange, transport)
    CANCELLED.clear()
    OPEN.clear()
    worker, thread = start_worker(exchange, transport, [Waits], threads_count=1)
    request = requester.send(Waits(name="cut"))
    assert requester.next(request.uuid)[0]["state"] == pr.RUNNING
    worker.stop(grace=0.1)
    thread.join(WAIT)
    assert CANCELLED == ["cut"]
    # Nothing was answered for it: the broker hands it to the next worker of the topic.
    OPEN.set()
    worker, thread = start_worker(exchange, transport, [Waits], threads_count=1)
    try:
        assert requester.outcome(request)[-1] == {"state": pr.SUCCESS, "data": {"result": "cut"}}
    finally:
        worker.stop(grace=WAIT)
        thread.join(WAIT)
        requester.close()


def test_a_cancel_that_overtakes_its_request_keeps_the_coroutine_from_running() -> None:
    runner = ar.AsyncRunner(concurrency=1)
    request_id = uuid.uuid4().hex
    assert runner.cancel([request_id]) == [], "nothing of it runs here yet"
    outcomes: list[Any] = []
    ran: list[str] = []
    ended = threading.Event()

    async def never() -> str:
        ran.append("never")
        return "ran"

    def done(outcome: Any) -> None:
        outcomes.append(outcome)
        ended.set()

    try:
        runner.start(request_id, "late", never, None, runner.lane(), done)
        assert ended.wait(WAIT)
    finally:
        runner.stop()
    assert outcomes == [ar.CANCELLED] and ran == []


def test_the_workers_command_shows_threads_and_async_slots_apart() -> None:
    from flowengine.cli.workers import _capacity

    assert _capacity({"capacity": 1008, "threads": 8, "async_slots": 1000}) == (
        "1008 (8 threads + 1000 async)")
    assert _capacity({"capacity": 1008, "threads": 2, "async_slots": 1000}) == (
        "1008 (2/8 threads + 1000 async)"), "an autoscaled pool below its most"
    assert _capacity({"capacity": 8, "threads": 8, "async_slots": 0}) == "8"


def test_an_awaited_task_keeps_its_lease_longer_than_the_lease(
        async_worker: wk.Worker, exchange: str, transport: dict[str, Any]) -> None:
    flow = uf.Flow("f").add(Waits("long", inject={"seconds": 1.0}))
    engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                          transition_timeout=WAIT, lease_timeout=0.4, heartbeat_interval=0.1,
                          **transport)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert RUNS == ["long"], "the heartbeats renewed its lease: it was never sent again"
