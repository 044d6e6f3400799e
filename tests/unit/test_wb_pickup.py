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
from flowengine.worker_based.executor import NOTIFY_PERIOD, WorkerTaskExecutor
from flowengine.worker_based.types import WorkerFinder

PICKUP = 3.0
#: Seconds a worker asked for a proof of life has to answer (the executors' lease timeout).
ANSWER = 4.0


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


def test_workers_not_heard_from_are_asked_once_and_judged_if_they_stay_silent() -> None:
    clock = ManualClock()
    finder = WorkerFinder(clock=clock)
    finder.add("t", ["a.B"], identity="frozen", flowengine=True)
    finder.add("t", ["a.B"], identity="taskflow")  # cannot be told to drop a request: never
    finder.add("other", ["a.B"], identity="elsewhere", flowengine=True)
    clock.advance(PICKUP)
    finder.add("t", ["a.B"], identity="lively", flowengine=True)
    assert finder.ask("t", clock.now - PICKUP + 0.1)  # only "frozen" is older than that
    assert not finder.ask("t", clock.now - PICKUP + 0.1), "asked twice"
    assert finder.asking
    assert [w.identity for w in finder.workers() if w.asked_at is not None] == ["frozen"]
    clock.advance(ANSWER - 0.1)
    assert finder.unanswered(ANSWER, caught_up=None) == []  # it still has time
    clock.advance(0.2)
    # Answers sent in time may still wait unread: not judged before they are read...
    assert finder.unanswered(ANSWER, caught_up=clock.now - 1.0) == []
    # ...or before a second window has passed.
    [judged] = finder.unanswered(ANSWER, caught_up=None)
    assert judged.identity == "frozen" and judged.judged and judged.silent
    assert not finder.asking
    finder.ask("t", clock.now)
    assert judged.asked_at is None, "judged: not asked again until heard from"
    picked = finder.get_worker_for_task("a.B", avoid=["lively", "taskflow", "elsewhere"])
    assert picked is not None and picked.identity != "frozen", "a judged worker is sent nothing"
    finder.seen("frozen")  # it thawed
    assert not judged.judged and not judged.silent
    clock.advance(1.0)
    finder.ask("t", clock.now)
    assert judged.asked_at == clock.now


def test_a_worker_that_answers_is_not_judged() -> None:
    clock = ManualClock()
    finder = WorkerFinder(clock=clock)
    finder.add("t", ["a.B"], identity="w1", flowengine=True)
    clock.advance(PICKUP + 1)
    assert finder.ask("t", clock.now - PICKUP)
    clock.advance(1.0)
    finder.add("t", ["a.B"], identity="w1", flowengine=True)  # its answer to the round
    clock.advance(ANSWER * 2)
    assert finder.unanswered(ANSWER, caught_up=None) == [] and not finder.asking


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


# ---- a worker that took a request and froze --------------------------------------------------


@pytest.fixture
def shared_topic(exchange: str) -> Any:
    """Two workers of one topic: ``frozen`` (started first, so it takes the first request, and
    then never answers) and ``lively``, started on demand (it answers when the test says: a
    scripted worker has no control queue to hear discovery rounds on)."""
    frozen = ScriptedWorker(exchange, "shared", "frozen-1", answers_notify=False)
    lively = ScriptedWorker(exchange, "shared", "lively-1")
    threads: list[threading.Thread] = []

    def start(worker: ScriptedWorker) -> ScriptedWorker:
        thread = threading.Thread(target=worker.proxy.start, daemon=True)
        thread.start()
        threads.append(thread)
        assert worker.proxy.wait(WAIT)
        return worker

    start(frozen)
    yield frozen, lambda: start(lively)
    for worker in (frozen, lively):
        worker.proxy.stop()
    for thread in threads:
        thread.join(WAIT)


def _shared_executor(exchange: str, clock: ManualClock, frozen: ScriptedWorker,
                     **options: Any) -> WorkerTaskExecutor:
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["shared"], transport="memory",
                                  clock=clock, pickup_timeout=PICKUP, lease_timeout=ANSWER,
                                  transition_timeout=60.0, **options)
    executor.cycles = DrainCycles(executor)  # type: ignore[attr-defined]
    executor.start()
    frozen.announce()
    assert executor.wait_for_workers(1, timeout=WAIT) == 0
    return executor


def test_a_request_a_worker_took_then_froze_holding_goes_to_another_worker_uncounted(
    exchange: str, clock: ManualClock, shared_topic: Any,
) -> None:  # fmt: skip
    frozen, start_lively = shared_topic
    executor = _shared_executor(exchange, clock, frozen, max_attempts=1)
    # Another engine of the process, with nothing in flight: the verdict reaches it too.
    bystander = _shared_executor(exchange, clock, frozen)
    try:
        future = executor.execute_task(Slow(), "atom-1", {})
        _data, held = frozen.next_request()  # taken, never started: the worker froze
        frozen.proxy.stop()  # it takes nothing more
        lively = start_lively()
        lively.announce()
        assert executor.wait_for_workers(2, timeout=WAIT) == 0
        assert bystander.wait_for_workers(2, timeout=WAIT) == 0
        # Nobody took it in time, and neither was heard from within a discovery period:
        # both are asked for a proof of life.
        clock.advance(NOTIFY_PERIOD + 0.1)
        executor.cycles.settle()  # type: ignore[attr-defined]
        executor.on_wait()
        asked = [w.identity for w in executor.finder.workers() if w.asked_at is not None]
        assert sorted(asked) == ["frozen-1", "lively-1"]
        lively.announce()  # its answer
        executor.cycles.settle()  # type: ignore[attr-defined]
        clock.advance(ANSWER - 0.2)
        executor.on_wait()
        assert lively.requests.empty(), "judged before its time to answer was out"
        clock.advance(0.3)
        executor.cycles.settle()  # type: ignore[attr-defined]
        executor.on_wait()
        _data, message = lively.next_request()
        assert message.properties["correlation_id"] != held.properties["correlation_id"]
        assert message.headers[pr.HEADER_ATTEMPT] == 2
        frozen_worker = executor.finder.get("frozen-1")
        assert frozen_worker is not None and frozen_worker.judged and frozen_worker.silent
        assert not executor.finder.get("lively-1").judged  # type: ignore[union-attr]
        # The other engine sends the frozen worker nothing either (its own verdicts are its
        # own: it asked nothing, so judged nothing).
        seen_there = bystander.finder.get("frozen-1")
        assert seen_there is not None and seen_there.silent and not seen_there.judged
        assert not bystander.finder.get("lively-1").silent  # type: ignore[union-attr]
        lively.reply(message, pr.SUCCESS, result="elsewhere")
        # max_attempts=1: sending it elsewhere did not count as an attempt.
        assert future.result(timeout=WAIT) == (EXECUTED, "elsewhere")
    finally:
        bystander.stop()
        executor.stop()


def test_a_request_a_frozen_worker_holds_waits_for_it_when_no_other_worker_runs_it(
    exchange: str, clock: ManualClock, shared_topic: Any,
) -> None:  # fmt: skip
    frozen, _start_lively = shared_topic
    executor = _shared_executor(exchange, clock, frozen)
    try:
        future = executor.execute_task(Slow(), "atom-1", {})
        _data, held = frozen.next_request()
        for _ in range(3):
            clock.advance(PICKUP + ANSWER)
            executor.on_wait()
        worker = executor.finder.get("frozen-1")
        assert worker is not None and worker.judged
        assert not future.done(), "failed though its holder may still thaw"
        frozen.reply(held, pr.SUCCESS, result="thawed")  # it thawed and ran it
        assert future.result(timeout=WAIT) == (EXECUTED, "thawed")
        assert not worker.judged, "heard from again"
    finally:
        executor.stop()
