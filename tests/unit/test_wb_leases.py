"""Leases, re-dispatch, WorkerLost, dead letters and time limits, driven by an injected clock.

A scripted worker (a real Proxy on kombu's memory transport) answers requests the way the test
says, so a worker that goes silent after RUNNING needs no killing and no sleeping.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from wb_lease_tasks import Slow  # tests/unit is on sys.path (pytest rootdir insertion)

from flowengine import exceptions as exc
from flowengine.engines.executor import EXECUTED
from flowengine.types.failure import Failure
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.dead_letters import DeadLetters
from flowengine.worker_based.engine_side import lifecycle as lc
from flowengine.worker_based.executor import PROOF_OF_LIFE, WorkerTaskExecutor

WAIT = 10.0
#: make_executor's heartbeat interval, in seconds of the test clock.
HEARTBEAT_INTERVAL = 1.0
TASK_CLS = pr.task_class_name(Slow())


class ScriptedWorker:
    """Consumes a topic and records requests; replies only when told to.

    ``capacity``: the free slots it advertises; ``answers_notify``: whether it answers
    discovery (else it is known only once it :meth:`announce` s itself).
    """

    def __init__(self, exchange: str, topic: str, identity: str, capacity: int | None = None,
                 answers_notify: bool = True) -> None:
        self.identity = identity
        self.topic = topic
        self.capacity = capacity
        self.answers_notify = answers_notify
        self.requests: queue.Queue[tuple[Any, Any]] = queue.Queue()
        handlers = {pr.REQUEST: dp.Handler(self._on_request),
                    pr.NOTIFY: dp.Handler(self._on_notify)}
        self.proxy = px.Proxy(topic, exchange, handlers, transport="memory")

    def _on_request(self, data: Any, message: Any) -> None:
        self.requests.put((data, message))

    def _on_notify(self, data: Any, message: Any) -> None:
        if self.answers_notify:
            self.proxy.publish(pr.Notify(topic=self.topic, tasks=[TASK_CLS]),
                               message.properties["reply_to"], headers=self.headers())

    def announce(self) -> None:
        """Tell every engine on the exchange about itself, unasked."""
        self.proxy.publish(pr.Notify(topic=self.topic, tasks=[TASK_CLS]),
                           pr.DISCOVERY_ROUTING_KEY, headers=self.headers(), declare_queue=False)

    def headers(self) -> dict[str, Any]:
        headers = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION, pr.HEADER_WORKER: self.identity}
        if self.capacity is not None:
            headers[pr.HEADER_CAPACITY] = self.capacity
        return headers

    def reply(self, message: Any, state: str, **data: Any) -> None:
        self.proxy.publish(pr.Response(state, **data), message.properties["reply_to"],
                           correlation_id=message.properties["correlation_id"],
                           headers=self.headers())

    def next_request(self) -> tuple[Any, Any]:
        return self.requests.get(timeout=WAIT)


class Recorded(ext.EventSink):
    """Keeps the events the executor emits."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, object]]] = []

    def emit(self, event_type: str, **fields: object) -> None:
        self.seen.append((event_type, fields))


@pytest.fixture
def exchange() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def worker(exchange: str) -> Any:
    scripted = ScriptedWorker(exchange, "leased", "worker-1")
    thread = threading.Thread(target=scripted.proxy.start, daemon=True)
    thread.start()
    assert scripted.proxy.wait(WAIT)
    yield scripted
    scripted.proxy.stop()
    thread.join(WAIT)


class DrainCycles:
    """Lets a test wait until the replies sent so far have landed (the client's consumer)."""

    def __init__(self, executor: WorkerTaskExecutor) -> None:
        self._executor = executor

    def settle(self) -> None:
        """Return once a whole drain cycle began after this call (so it saw prior replies)."""
        assert self._executor.client.wait_drained(WAIT)

    def caught_up(self) -> None:
        """Return once a drain begun after this call found the reply queue empty: the next
        look at the executor (its own housekeeping's, or the test's) takes the queue as read
        up to the test clock's time now, so silence before then is believed (lc.Tick)."""
        assert self._executor.client.proxy.wait_idle_after(time.monotonic(), WAIT)


def make_executor(exchange: str, clock: ManualClock, *, known: int = 1,
                  **options: Any) -> WorkerTaskExecutor:
    """A started executor on ``clock``, once it knows ``known`` workers."""
    executor = WorkerTaskExecutor(
        uuid.uuid4().hex, exchange, ["leased"], transport="memory", clock=clock,
        lease_timeout=options.pop("lease_timeout", 5.0), heartbeat_interval=HEARTBEAT_INTERVAL,
        **options)
    executor.cycles = DrainCycles(executor)  # type: ignore[attr-defined]
    executor.start()
    assert executor.wait_for_workers(known, timeout=WAIT) == 0
    return executor


def second_attempt_succeeds(worker: ScriptedWorker, future: Any, result: str) -> None:
    """The worker receives the request's second attempt and runs it: ``future`` ends with
    ``result``."""
    _data, message = worker.next_request()
    assert message.headers[pr.HEADER_ATTEMPT] == 2
    worker.reply(message, pr.SUCCESS, result=result)
    assert future.result(timeout=WAIT) == (EXECUTED, result)


def test_a_silent_worker_loses_its_lease_and_the_request_is_sent_again(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock, max_attempts=3)
    try:
        future = executor.execute_task(Slow(), "atom-1", {})
        first, message = worker.next_request()
        assert message.headers[ext.HEADER_HEARTBEAT] == 1.0
        worker.reply(message, pr.RUNNING)
        # RUNNING renews the lease; a heartbeat renews it again.
        executor.cycles.settle()
        clock.now += 4.0
        worker.reply(message, pr.EVENT, event_type=ext.EVENT_HEARTBEAT, details={})
        executor.cycles.settle()
        assert executor.attempts()[0].lease_until == clock.now + 5.0
        clock.now += 4.9
        executor.on_wait()
        assert worker.requests.empty()
        clock.now += 0.2
        executor.on_wait()
        second, message2 = worker.next_request()
        assert message2.headers[pr.HEADER_ATTEMPT] == 2
        assert message2.properties["correlation_id"] != message.properties["correlation_id"]
        # The lapsed attempt wakes up and answers: ignored; the new attempt's answer counts.
        worker.reply(message, pr.SUCCESS, result="stale")
        worker.reply(message2, pr.RUNNING)
        worker.reply(message2, pr.SUCCESS, result="fresh")
        assert future.result(timeout=WAIT) == (EXECUTED, "fresh")
    finally:
        executor.stop()


def test_a_request_whose_only_worker_fell_silent_waits_for_it_not_failing_as_unserved(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock, max_attempts=3, unserved_timeout=1.0,
                             transition_timeout=60.0)
    try:
        future = executor.execute_task(Slow(), "atom-1", {})
        _data, message = worker.next_request()
        worker.reply(message, pr.RUNNING)
        executor.cycles.settle()
        clock.advance(6.0)  # no heartbeat: the lease lapses, the worker is sent nothing
        # A housekeeping pass between the settle and the advance may have taken the last
        # empty drain as read at the old time: wait for one after it.
        executor.cycles.caught_up()  # type: ignore[attr-defined]
        executor.on_wait()
        silent = executor.finder.get("worker-1")
        assert silent is not None and silent.silent
        for _ in range(5):  # well past the unserved timeout, within the transition timeout
            clock.advance(2.0)
            executor.on_wait()
        assert not future.done(), "failed as if no worker ran the class"
        worker.announce()  # it is back (a frozen VM resumed)
        second_attempt_succeeds(worker, future, "done")
    finally:
        executor.stop()


def test_a_worker_one_engine_found_silent_is_sent_nothing_by_the_process_other_engines(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # The engines of a process share one broker client, and with it the verdict: a frozen
    # worker costs the process one lost attempt, not one per engine that still trusted it.
    first = make_executor(exchange, clock, max_attempts=3, transition_timeout=60.0)
    second = make_executor(exchange, clock, max_attempts=3, transition_timeout=60.0)
    later = None
    try:
        assert first.client is second.client
        future = first.execute_task(Slow(), "atom-1", {})
        _data, message = worker.next_request()
        worker.reply(message, pr.RUNNING)
        first.cycles.settle()
        clock.advance(6.0)  # no heartbeat: the first engine's lease lapses
        first.cycles.caught_up()
        first.on_wait()
        for executor in (first, second):
            silent = executor.finder.get("worker-1")
            assert silent is not None and silent.silent
        # An engine made after the verdict starts with it too.
        later = make_executor(exchange, clock, max_attempts=3, transition_timeout=60.0)
        known = later.finder.get("worker-1")
        assert known is not None and known.silent
        held_back = second.execute_task(Slow(), "atom-2", {})
        second.cycles.settle()
        assert [a.state for a in second.attempts()] == [lc.WAITING]
        assert worker.requests.empty(), "sent to the worker another engine found silent"
        worker.announce()  # it is back (a frozen VM resumed): every engine hears it
        requests = [worker.next_request() for _ in range(2)]
        assert sorted(m.headers[pr.HEADER_ATTEMPT] for _d, m in requests) == [1, 2]
        for _data, request in requests:
            worker.reply(request, pr.SUCCESS, result="done")
        assert future.result(timeout=WAIT) == (EXECUTED, "done")
        assert held_back.result(timeout=WAIT) == (EXECUTED, "done")
        assert not second.finder.get("worker-1").silent  # type: ignore[union-attr]
    finally:
        for executor in (first, second, later):
            if executor is not None:
                executor.stop()


def test_a_worker_one_engine_hears_from_again_may_be_sent_work_by_the_others(
    exchange: str, clock: ManualClock
) -> None:
    # A worker that answers no discovery round: only replies to attempts tell of it.
    quiet = ScriptedWorker(exchange, "leased", "quiet-1", answers_notify=False)
    thread = threading.Thread(target=quiet.proxy.start, daemon=True)
    thread.start()
    assert quiet.proxy.wait(WAIT)
    first = make_executor(exchange, clock, known=0, transition_timeout=60.0)
    second = None
    try:
        quiet.announce()
        assert first.wait_for_workers(1, timeout=WAIT) == 0
        second = make_executor(exchange, clock, transition_timeout=60.0)
        lapsing = first.execute_task(Slow(), "atom-1", {})
        _data, lapsed = quiet.next_request()
        quiet.reply(lapsed, pr.RUNNING)
        first.cycles.settle()  # type: ignore[attr-defined]
        clock.advance(4.0)
        running = second.execute_task(Slow(), "atom-2", {})
        _data, kept = quiet.next_request()
        quiet.reply(kept, pr.RUNNING)
        second.cycles.settle()  # type: ignore[attr-defined]
        clock.advance(2.0)  # the first engine's lease lapsed; the second's still holds
        first.cycles.caught_up()  # type: ignore[attr-defined]
        first.on_wait()
        assert second.finder.get("quiet-1").silent  # type: ignore[union-attr]
        assert [a.state for a in first.attempts()] == [lc.WAITING]
        quiet.reply(kept, pr.SUCCESS, result="kept")  # the second engine hears from it
        assert running.result(timeout=WAIT) == (EXECUTED, "kept")
        # ... and so does the first: its next attempt goes there without a NOTIFY.
        second_attempt_succeeds(quiet, lapsing, "again")
    finally:
        for executor in (first, second):
            if executor is not None:
                executor.stop()
        quiet.proxy.stop()
        thread.join(WAIT)


def test_after_the_last_attempt_the_atom_fails_with_worker_lost_and_is_parked(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock, max_attempts=2)
    try:
        future = executor.execute_task(Slow(name="slow-one"), "atom-2", {})
        for _attempt in range(2):
            _data, message = worker.next_request()
            worker.reply(message, pr.RUNNING)
            executor.cycles.settle()
            clock.now += 6.0
            executor.on_wait()
        outcome, failure = future.result(timeout=WAIT)
        assert isinstance(failure, Failure) and failure.check(exc.WorkerLost)
        assert "slow-one" in failure.exception_str and "2 attempt" in failure.exception_str
        assert "worker-1" in failure.exception_str
    finally:
        executor.stop()
    letters = DeadLetters(exchange, transport="memory")
    try:
        parked = letters.list()
        assert [(p.task_name, p.topic, p.workers) for p in parked] == [
            ("slow-one", "leased", ["worker-1", "worker-1"])]
        assert "lost" in parked[0].reason
        assert letters.list() == parked, "listing must leave the dead letters in place"
        letters.requeue(parked[0].id)
        data, message = worker.next_request()
        assert data["task_name"] == "slow-one"
        assert pr.HEADER_DEADLINE in message.headers
        assert letters.list() == []
        with pytest.raises(exc.NotFound):
            letters.requeue(parked[0].id)
    finally:
        letters.close()


def test_a_task_over_its_time_limit_fails_with_a_timeout(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock, time_limits={"limited": 3.0})
    try:
        future = executor.execute_task(Slow(name="limited"), "atom-3", {})
        _data, message = worker.next_request()
        assert message.headers[pr.HEADER_TIME_LIMIT] == 3.0
        worker.reply(message, pr.RUNNING)
        executor.cycles.settle()
        clock.now += 2.0
        worker.reply(message, pr.EVENT, event_type=ext.EVENT_HEARTBEAT, details={})
        executor.cycles.settle()
        executor.on_wait()
        assert not future.done()
        clock.now += 1.5
        executor.on_wait()
        _outcome, failure = future.result(timeout=WAIT)
        assert failure.check(exc.TaskTimeLimitExceeded)
        assert "limited" in failure.exception_str
    finally:
        executor.stop()


def test_a_request_nobody_takes_expires_after_the_transition_timeout(
    exchange: str, clock: ManualClock
) -> None:
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, [], transport="memory",
                                  clock=clock, transition_timeout=30.0)
    executor.start()
    try:
        future = executor.execute_task(Slow(name="orphan"), "atom-4", {})
        clock.now += 29.0
        executor.on_wait()
        assert not future.done()
        clock.now += 2.0
        executor.on_wait()
        _outcome, failure = future.result(timeout=WAIT)
        assert failure.check(exc.RequestTimeout) and "orphan" in failure.exception_str
    finally:
        executor.stop()


def test_an_unpublished_request_can_be_cancelled_but_a_published_one_cannot(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock)
    try:
        published = executor.execute_task(Slow(name="sent"), "atom-5", {})
        worker.next_request()
        assert not published.cancel(), "a worker may already run it: it must be waited for"
        executor.finder.clear()
        waiting = executor.execute_task(Slow(name="unsent"), "atom-6", {})
        assert waiting.cancel()
        assert all(a.task_name != "unsent" for a in executor.attempts())
    finally:
        executor.stop()


def test_an_attempt_taken_by_an_undiscovered_worker_survives_the_first_worker_going_offline(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # Workers of a topic share its queue, and a new worker's announcement travels on another
    # queue than its replies: its RUNNING can arrive before the engine has heard of it.
    events = Recorded()
    executor = make_executor(exchange, clock, max_attempts=3, events=events)
    try:
        future = executor.execute_task(Slow(name="moved"), "atom-7", {})
        _data, message = worker.next_request()
        newcomer = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION, pr.HEADER_WORKER: "worker-2"}
        worker.proxy.publish(pr.Response(pr.RUNNING), message.properties["reply_to"],
                             correlation_id=message.properties["correlation_id"],
                             headers=newcomer)
        executor.cycles.settle()
        [moved] = [fields for kind, fields in events.seen if kind == "task-moved"]
        assert (moved["worker"], moved["from_worker"], moved["attempt"]) == (
            "worker-2", "worker-1", 1)
        offline = dict(worker.headers(), **{pr.HEADER_WORKER_STATUS: pr.WORKER_OFFLINE})
        worker.proxy.publish(pr.Notify(topic=worker.topic, tasks=[TASK_CLS]),
                             pr.DISCOVERY_ROUTING_KEY, headers=offline, declare_queue=False)
        executor.cycles.settle()
        assert executor.finder.get("worker-1") is None
        assert worker.requests.empty(), "the attempt worker-2 holds must not be sent again"
        worker.proxy.publish(pr.Response(pr.SUCCESS, result="done"),
                             message.properties["reply_to"],
                             correlation_id=message.properties["correlation_id"],
                             headers=newcomer)
        assert future.result(timeout=WAIT) == (EXECUTED, "done")
    finally:
        executor.stop()


def test_a_worker_going_offline_loses_the_attempts_it_holds(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock, max_attempts=2)
    try:
        future = executor.execute_task(Slow(name="held"), "atom-8", {})
        _data, message = worker.next_request()
        worker.reply(message, pr.RUNNING)
        executor.cycles.settle()
        offline = dict(worker.headers(), **{pr.HEADER_WORKER_STATUS: pr.WORKER_OFFLINE})
        worker.proxy.publish(pr.Notify(topic=worker.topic, tasks=[TASK_CLS]),
                             pr.DISCOVERY_ROUTING_KEY, headers=offline, declare_queue=False)
        # Re-dispatched once the worker is known again (it is the only one).
        worker.proxy.publish(pr.Notify(topic=worker.topic, tasks=[TASK_CLS]),
                             pr.DISCOVERY_ROUTING_KEY, headers=worker.headers(),
                             declare_queue=False)
        second_attempt_succeeds(worker, future, "again")
    finally:
        executor.stop()


def test_a_request_found_waiting_by_two_threads_at_once_is_published_once(
    exchange: str, clock: ManualClock, worker: ScriptedWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine's submit and the pass over waiting requests a worker's arrival starts can
    # both find an attempt WAITING. Here the pass runs right after the submit looked (inside
    # its choice of a worker): the request must still go out once.
    executor = make_executor(exchange, clock, max_attempts=3)
    choose = executor.finder.get_worker_for_task
    interleaved: list[bool] = []

    def choose_while_the_other_thread_sends(*args: Any, **kwargs: Any) -> Any:
        if not interleaved:
            interleaved.append(True)
            executor.dispatch_waiting()  # the other thread, finding it WAITING too
        return choose(*args, **kwargs)

    monkeypatch.setattr(executor.finder, "get_worker_for_task",
                        choose_while_the_other_thread_sends)
    try:
        future = executor.execute_task(Slow(name="once"), "atom-16", {})
        _data, message = worker.next_request()
        worker.reply(message, pr.SUCCESS, result="once")
        assert future.result(timeout=WAIT) == (EXECUTED, "once")
        assert interleaved and worker.requests.empty(), "published twice"
    finally:
        executor.stop()


def test_a_request_made_while_an_earlier_one_waits_for_a_worker_is_sent_after_it(
    exchange: str, clock: ManualClock, worker: ScriptedWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first request found no worker (it waits for the pass a worker's arrival starts);
    # the worker is known by the time the second is made. Published at once, the second
    # would reach a one-thread worker first: it must wait for the pass, which sends both in
    # the order they were made.
    executor = make_executor(exchange, clock, max_attempts=3)
    choose = executor.finder.get_worker_for_task
    looks: list[str] = []

    def none_for_the_first(*args: Any, **kwargs: Any) -> Any:
        looks.append(args[0])
        return None if len(looks) == 1 else choose(*args, **kwargs)

    monkeypatch.setattr(executor.finder, "get_worker_for_task", none_for_the_first)
    try:
        first = executor.execute_task(Slow(name="first"), "atom-17", {})
        second = executor.execute_task(Slow(name="second"), "atom-18", {})
        received = [worker.next_request(), worker.next_request()]
        assert [data["task_name"] for data, _message in received] == ["first", "second"]
        for (data, message), future in zip(received, (first, second)):
            worker.reply(message, pr.SUCCESS, result=data["task_name"])
            assert future.result(timeout=WAIT) == (EXECUTED, data["task_name"])
    finally:
        executor.stop()


def _go_offline(worker: ScriptedWorker) -> None:
    offline = dict(worker.headers(), **{pr.HEADER_WORKER_STATUS: pr.WORKER_OFFLINE})
    worker.proxy.publish(pr.Notify(topic=worker.topic, tasks=[TASK_CLS]),
                         pr.DISCOVERY_ROUTING_KEY, headers=offline, declare_queue=False)


def test_a_quiet_attempt_whose_worker_goes_offline_is_kept_by_the_worker_that_runs_it(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # Sent to worker-1, taken from the shared queue by worker-2, which says nothing yet (a
    # short task): worker-1 going offline must not send it again while worker-2 runs it.
    executor = make_executor(exchange, clock, max_attempts=3, quiet_start=True)
    try:
        future = executor.execute_task(Slow(name="quiet"), "atom-14", {})
        _data, message = worker.next_request()
        _go_offline(worker)
        executor.cycles.settle()  # type: ignore[attr-defined]
        [attempt] = executor.attempts()
        assert attempt.state == pr.RUNNING and attempt.suspect is not None
        worker.proxy.publish(pr.Response(pr.SUCCESS, result="once"),
                             message.properties["reply_to"],
                             correlation_id=message.properties["correlation_id"],
                             headers=dict(worker.headers(), **{pr.HEADER_WORKER: "worker-2"}))
        assert future.result(timeout=WAIT) == (EXECUTED, "once")
        assert worker.requests.empty(), "sent once"
    finally:
        executor.stop()


def test_a_quiet_attempt_no_worker_proves_it_runs_is_lost_with_its_worker(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock, max_attempts=2, quiet_start=True)
    try:
        future = executor.execute_task(Slow(name="gone"), "atom-15", {})
        _data, message = worker.next_request()
        _go_offline(worker)
        executor.cycles.settle()  # type: ignore[attr-defined]
        clock.now += PROOF_OF_LIFE * HEARTBEAT_INTERVAL - 0.1
        executor.on_wait()
        assert worker.requests.empty(), "not before its holder had time to say it runs it"
        clock.now += 0.2
        executor.on_wait()
        # Sent again once the worker is known again (it is the only one).
        worker.proxy.publish(pr.Notify(topic=worker.topic, tasks=[TASK_CLS]),
                             pr.DISCOVERY_ROUTING_KEY, headers=worker.headers(),
                             declare_queue=False)
        _data, again = worker.next_request()
        assert again.headers[pr.HEADER_ATTEMPT] == 2
        worker.reply(again, pr.SUCCESS, result="again")
        assert future.result(timeout=WAIT) == (EXECUTED, "again")
    finally:
        executor.stop()


def test_without_quiet_starts_an_attempt_whose_worker_goes_offline_is_sent_again_at_once(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # The memory transport's default (as Redis's): workers say RUNNING first, so a PENDING
    # attempt is not running anywhere and needs no proof of life before it goes elsewhere.
    executor = make_executor(exchange, clock, max_attempts=2)
    try:
        future = executor.execute_task(Slow(name="loud"), "atom-16", {})
        _data, message = worker.next_request()
        assert message.headers[pr.HEADER_PROTOCOL] == 1  # RUNNING first, please
        _go_offline(worker)
        executor.cycles.settle()  # type: ignore[attr-defined]
        [attempt] = executor.attempts()
        assert (attempt.state, attempt.number) == (pr.WAITING, 2)  # lost at once: no proof awaited
        worker.proxy.publish(pr.Notify(topic=worker.topic, tasks=[TASK_CLS]),
                             pr.DISCOVERY_ROUTING_KEY, headers=worker.headers(),
                             declare_queue=False)
        _data, again = worker.next_request()
        worker.reply(again, pr.SUCCESS, result="again")
        assert future.result(timeout=WAIT) == (EXECUTED, "again")
    finally:
        executor.stop()


def hand_back(worker: ScriptedWorker, message: Any, by: str = "worker-2") -> None:
    """What a worker does with a request the broker redelivered to it: return it unrun."""
    worker.proxy.publish(
        pr.Response(pr.EVENT, event_type=ext.EVENT_REDELIVERED, details={"worker": by}),
        message.properties["reply_to"], correlation_id=message.properties["correlation_id"],
        headers=dict(worker.headers(), **{pr.HEADER_WORKER: by}))  # fmt: skip


def say_returned(worker: ScriptedWorker, message: Any) -> None:
    """What a stopping worker says of a request it gives back to the broker unstarted."""
    worker.proxy.publish(
        pr.Response(pr.EVENT, event_type=ext.EVENT_RETURNED,
                    details={"worker": worker.identity}),
        message.properties["reply_to"], correlation_id=message.properties["correlation_id"],
        headers=worker.headers())  # fmt: skip


def test_a_started_attempt_handed_back_after_a_redelivery_counts_as_lost(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # A request that kills whichever worker runs it: the broker redelivers it each time, and
    # only the engine's count of handed-back attempts stops it going round the topic forever.
    executor = make_executor(exchange, clock, max_attempts=2)
    try:
        future = executor.execute_task(Slow(name="poison"), "atom-9", {})
        _data, first = worker.next_request()
        worker.reply(first, pr.RUNNING)
        hand_back(worker, first)
        outlive_proof_of_life(executor, clock)
        _data, second = worker.next_request()
        assert second.headers[pr.HEADER_ATTEMPT] == 2
        worker.reply(second, pr.RUNNING)
        hand_back(worker, second, by="worker-3")
        outlive_proof_of_life(executor, clock)
        _outcome, failure = future.result(timeout=WAIT)
        assert failure.check(exc.WorkerLost) and "2 attempt" in failure.exception_str
    finally:
        executor.stop()
    letters = DeadLetters(exchange, transport="memory")
    try:
        [parked] = letters.list()
        assert "redelivered it to worker worker-3" in parked.reason, parked.reason
    finally:
        letters.close()


def outlive_proof_of_life(executor: WorkerTaskExecutor, clock: ManualClock) -> None:
    """Let what the worker sent land, then pass the time a holder has to send a heartbeat."""
    executor.cycles.settle()  # type: ignore[attr-defined]
    clock.now += PROOF_OF_LIFE * HEARTBEAT_INTERVAL + 0.1
    executor.on_wait()


def test_a_running_attempt_handed_back_is_kept_if_its_worker_proves_it_is_alive(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # Redis hands out again a message unsettled past its visibility timeout, though the
    # worker running it is fine: that worker's next heartbeat keeps the attempt.
    executor = make_executor(exchange, clock, max_attempts=1)
    try:
        future = executor.execute_task(Slow(name="long"), "atom-12", {})
        _data, message = worker.next_request()
        worker.reply(message, pr.RUNNING)
        hand_back(worker, message)
        executor.cycles.settle()  # type: ignore[attr-defined]
        worker.reply(message, pr.EVENT, event_type=ext.EVENT_HEARTBEAT, details={})
        outlive_proof_of_life(executor, clock)
        assert worker.requests.empty(), "an attempt whose worker is alive is not sent again"
        worker.reply(message, pr.SUCCESS, result="finished once")
        assert future.result(timeout=WAIT) == (EXECUTED, "finished once")
    finally:
        executor.stop()


def test_an_unstarted_attempt_handed_back_is_sent_again_without_using_up_an_attempt(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # A stopping worker gives back what it prefetched and never ran, and says so: no attempt
    # was lost.
    executor = make_executor(exchange, clock, max_attempts=1)
    try:
        future = executor.execute_task(Slow(name="prefetched"), "atom-10", {})
        _data, first = worker.next_request()
        say_returned(worker, first)
        hand_back(worker, first)
        _data, second = worker.next_request()
        assert second.headers[pr.HEADER_ATTEMPT] == 2
        # A late hand-back of the first attempt changes nothing.
        hand_back(worker, first)
        worker.reply(second, pr.RUNNING)
        worker.reply(second, pr.SUCCESS, result="ran once")
        assert future.result(timeout=WAIT) == (EXECUTED, "ran once")
        assert worker.requests.empty()
    finally:
        executor.stop()


def test_unstarted_hand_backs_are_bounded_too(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock, max_attempts=1)
    try:
        future = executor.execute_task(Slow(name="bounced"), "atom-11", {})
        for _ in range(2):  # one free resend (max_attempts), then the hand-back counts
            _data, message = worker.next_request()
            say_returned(worker, message)
            hand_back(worker, message)
        _outcome, failure = future.result(timeout=WAIT)
        assert failure.check(exc.WorkerLost)
    finally:
        executor.stop()


def test_an_attempt_nobody_said_started_may_have_run_when_it_is_handed_back(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # A short task's worker sends no RUNNING reply: a request that killed it at once looks
    # PENDING to the engine. Handed back, it costs an attempt once its holder fails to prove it
    # is alive (as a RUNNING one would), so it cannot go round the topic uncounted.
    executor = make_executor(exchange, clock, max_attempts=1, quiet_start=True)
    try:
        future = executor.execute_task(Slow(name="quiet"), "atom-12", {})
        _data, message = worker.next_request()
        hand_back(worker, message)
        executor.cycles.settle()  # type: ignore[attr-defined]
        [attempt] = executor.attempts()
        assert attempt.state == pr.RUNNING and attempt.suspect is not None
        clock.now += PROOF_OF_LIFE * HEARTBEAT_INTERVAL + 0.1
        executor.on_wait()
        _outcome, failure = future.result(timeout=WAIT)
        assert failure.check(exc.WorkerLost)
        assert worker.requests.empty(), "not sent again: max_attempts=1 was used up"
    finally:
        executor.stop()


def test_an_alive_holder_of_a_quiet_attempt_keeps_it_after_a_hand_back(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    executor = make_executor(exchange, clock, max_attempts=1, quiet_start=True)
    try:
        future = executor.execute_task(Slow(name="short"), "atom-13", {})
        _data, message = worker.next_request()
        hand_back(worker, message)
        worker.reply(message, pr.RUNNING)  # outlived the threshold: alive after all
        executor.cycles.settle()  # type: ignore[attr-defined]
        clock.now += PROOF_OF_LIFE * HEARTBEAT_INTERVAL + 0.1
        executor.on_wait()
        worker.reply(message, pr.SUCCESS, result="once")
        assert future.result(timeout=WAIT) == (EXECUTED, "once")
    finally:
        executor.stop()


def test_requests_in_flight_are_scanned_only_when_a_deadline_falls_due(
    exchange: str, clock: ManualClock, worker: ScriptedWorker
) -> None:
    # The worker never answers: every request stays PENDING. Scanning thousands each
    # housekeeping round would cost the consumer thread; nothing is due before the earliest
    # deadline.
    executor = make_executor(exchange, clock, transition_timeout=30.0)
    try:
        futures = [executor.execute_task(Slow(name=f"w{i}"), f"atom-w{i}", {}) for i in range(50)]
        for _ in range(10):
            executor.on_wait()
        assert executor.statistics["attempts_looked_at"] == 0, "nothing was due yet"
        clock.now += 31.0
        executor.on_wait()
        assert executor.statistics["attempts_looked_at"] == 50
        assert all(f.result(timeout=WAIT)[1].check(exc.RequestTimeout) for f in futures)
    finally:
        executor.stop()
