"""Routing only to an engine's topics, and passing over workers that take nothing, on a clock.

Scripted workers (real Proxies on kombu's memory transport) announce themselves and take
requests only when the test says, so a worker that never consumes needs no broker trickery.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from test_wb_leases import WAIT, DrainCycles, ScriptedWorker
from wb_lease_tasks import Slow  # tests/unit is on sys.path (pytest rootdir insertion)

from flowengine.engines.executor import EXECUTED
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.executor import WorkerTaskExecutor
from flowengine.worker_based.types import WorkerFinder

PICKUP = 3.0


# ---- the finder ----------------------------------------------------------------------------------


def test_the_finder_keeps_only_workers_of_its_topics() -> None:
    finder = WorkerFinder(topics=["cell1"])
    assert finder.add("cell2", ["a.B"], identity="w2") is None
    assert finder.add("cell1", ["a.B"], identity="w1") is not None
    assert [w.identity for w in finder.workers()] == ["w1"]
    anywhere = WorkerFinder()  # no topic listed: every worker of the exchange
    anywhere.add("cell2", ["a.B"], identity="w2")
    assert [w.identity for w in anywhere.workers()] == ["w2"]


def test_passed_over_workers_are_chosen_only_when_no_other_runs_the_class() -> None:
    clock = ManualClock()
    finder = WorkerFinder(clock=clock)
    finder.add("quiet", ["a.B"], identity="q", capacity=256)
    finder.add("busy", ["a.B"], identity="b", capacity=0)
    picked = finder.get_worker_for_task("a.B")
    assert picked is not None and picked.identity == "q"  # the most free slots
    assert finder.quiet_since("quiet", clock.now - PICKUP)
    assert [w.identity for w in finder.pass_over("quiet")] == ["q"]
    picked = finder.get_worker_for_task("a.B")
    assert picked is not None and picked.identity == "b"
    finder.remove("b")
    picked = finder.get_worker_for_task("a.B")  # better a passed-over worker than none
    assert picked is not None and picked.identity == "q"
    finder.heard_on("quiet")  # a reply from its topic: it consumes after all
    assert not finder.quiet_since("quiet", clock.now - PICKUP)
    assert finder.get("q") is not None and not finder.get("q").passed_over  # type: ignore[union-attr]


# ---- the executor --------------------------------------------------------------------------------


@pytest.fixture
def exchange() -> str:
    return f"pickup-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def workers(exchange: str) -> Any:
    """A worker that claims every slot free (the first choice) and one that has none."""
    made = [ScriptedWorker(exchange, "quiet", "quiet-1", capacity=256, answers_notify=False),
            ScriptedWorker(exchange, "busy", "busy-1", capacity=0)]
    threads = [threading.Thread(target=w.proxy.start, daemon=True) for w in made]
    for thread in threads:
        thread.start()
    for worker in made:
        assert worker.proxy.wait(WAIT)
    yield made
    for worker in made:
        worker.proxy.stop()
    for thread in threads:
        thread.join(WAIT)


def _executor(exchange: str, clock: ManualClock, quiet: ScriptedWorker, known: int = 2,
              **options: Any) -> WorkerTaskExecutor:
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["quiet", "busy"],
                                  transport="memory", clock=clock, pickup_timeout=PICKUP,
                                  transition_timeout=60.0, **options)
    executor.cycles = DrainCycles(executor)  # type: ignore[attr-defined]
    executor.start()
    quiet.announce()  # once: it answers no discovery round (that would take it back)
    assert executor.wait_for_workers(known, timeout=WAIT) == 0
    return executor


def test_a_request_nobody_takes_goes_to_another_worker_uncounted(
    exchange: str, clock: ManualClock, workers: list[ScriptedWorker],
) -> None:  # fmt: skip
    quiet, busy = workers
    executor = _executor(exchange, clock, quiet, max_attempts=1)
    try:
        future = executor.execute_task(Slow(), "atom-1", {})
        _data, untaken = quiet.next_request()  # taken here only to look at: never answered
        clock.advance(PICKUP - 0.1)
        executor.on_wait()
        assert busy.requests.empty()  # within the bound: it waits
        clock.advance(0.2)
        executor.on_wait()
        _data, message = busy.next_request()
        assert message.properties["correlation_id"] != untaken.properties["correlation_id"]
        assert message.headers[pr.HEADER_ATTEMPT] == 2
        busy.reply(message, pr.SUCCESS, result="elsewhere")
        # max_attempts=1: the passed-over attempt did not count as one.
        assert future.result(timeout=WAIT) == (EXECUTED, "elsewhere")
        assert executor.finder.get("quiet-1").passed_over  # type: ignore[union-attr]
        # The next request goes straight to the worker that takes them.
        executor.execute_task(Slow(), "atom-2", {})
        _data, message = busy.next_request()
        assert message.headers[pr.HEADER_ATTEMPT] == 1
    finally:
        executor.stop()


def test_a_topic_heard_from_within_the_bound_is_waited_for(
    exchange: str, clock: ManualClock, workers: list[ScriptedWorker],
) -> None:  # fmt: skip
    quiet, busy = workers
    executor = _executor(exchange, clock, quiet)
    try:
        executor.execute_task(Slow(), "atom-1", {})
        _data, running = quiet.next_request()
        quiet.reply(running, pr.RUNNING)
        executor.cycles.settle()  # type: ignore[attr-defined]
        executor.execute_task(Slow(), "atom-2", {})
        _data, queued = quiet.next_request()  # behind the running one, on the same topic
        for _ in range(3):
            clock.advance(PICKUP * 0.9)
            quiet.reply(running, pr.EVENT, event_type=ext.EVENT_HEARTBEAT, details={})
            executor.cycles.settle()  # type: ignore[attr-defined]
            executor.on_wait()
        assert busy.requests.empty(), "a busy worker's topic was passed over"
        assert not executor.finder.get("quiet-1").passed_over  # type: ignore[union-attr]
    finally:
        executor.stop()


def test_with_no_other_capable_worker_the_request_waits_where_it_is(
    exchange: str, clock: ManualClock, workers: list[ScriptedWorker],
) -> None:  # fmt: skip
    quiet, busy = workers
    busy.proxy.stop()
    executor = _executor(exchange, clock, quiet, known=1)
    try:
        future = executor.execute_task(Slow(), "atom-1", {})
        _data, message = quiet.next_request()
        clock.advance(PICKUP * 2)
        executor.on_wait()
        executor.cycles.settle()  # type: ignore[attr-defined]
        assert quiet.requests.empty()  # not sent again to the same topic
        quiet.reply(message, pr.SUCCESS, result="late but fine")
        assert future.result(timeout=WAIT) == (EXECUTED, "late but fine")
    finally:
        executor.stop()


def test_a_request_a_known_worker_can_run_waits_for_its_turn_to_be_sent_however_long(
    exchange: str, clock: ManualClock,
) -> None:  # fmt: skip
    # With thousands of flows, the pass that sends the requests waiting for a worker queues
    # behind other engines' work on the client's one dispatch thread: a request a known worker
    # can run is not "unserved" meanwhile, only one no known worker can run.
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["t"], transport="memory",
                                  clock=clock, unserved_timeout=1.0, transition_timeout=60.0)
    executor.start()
    busy, done = threading.Event(), threading.Event()
    try:
        executor.client.submit(busy.wait)  # the dispatch thread is taken
        future = executor.execute_task(Slow("slow"), "uuid-slow", {})  # no worker yet: waits
        executor.finder.add("t", [pr.task_class_name(Slow("probe"))], identity="w1")
        clock.advance(5.0)
        executor.on_wait()
        assert not future.done(), "failed as unserved though a known worker runs it"
        busy.set()
        executor.client.submit(done.set)  # after the queued pass over the waiting requests
        assert done.wait(WAIT)
        [sent] = [m for m in executor.client.proxy.browse("t")
                  if m.properties.get("type") == pr.REQUEST]  # besides the NOTIFY rounds
        assert sent.json()["task_name"] == "slow"
        executor.finder.remove("w1")
        executor.finder.add("t", ["other.Task"], identity="w2")
        other = executor.execute_task(Slow("second"), "uuid-second", {})
        clock.advance(5.0)
        executor.on_wait()
        assert isinstance(other.result(WAIT)[1].exception, Exception)  # none runs it: unserved
    finally:
        busy.set()
        executor.stop()
