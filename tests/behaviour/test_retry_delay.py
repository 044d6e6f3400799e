"""Retry delay and backoff (a flowengine extension): waiting never blocks other ready atoms.

Nothing here measures time. A retry's wait is the span between its RETRYING notification and the
next attempt's task ``execute``; the ledger shows what ran inside that span and in which order
attempts came. Local engines hold the wait before the controller's next ``execute``; the
worker-based engine runs the controller at once and sends the subflow's first request as a
delayed dispatch (held by the process's broker client on the memory transport, see
doc/priorities.rst), so its wait ends when a worker may take that request.
An independent linear chain of steps runs beside the retried subflow: several of its steps inside
a wait prove the engine went on starting atoms while the retry waited (that test holds the wait
open on an injected clock, engine option ``retry_clock``, and the clock held requests are due by,
until the chain has moved on).
"""

from __future__ import annotations

import queue
import threading
import time

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine import retry, states
from flowengine.engines.actions import META_RETRY_DUE
from flowengine.engines.delays import DelayTimer
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based.engine_side import delayed_dispatch as dd
from flowengine.worker_based.engine_side import held_publishes

from . import delays, tasks

SIDE_STEPS = 40


def delayed_flow(attempts: int = 3, succeed_at: int = 3, **delay):
    retried = lf.Flow("retried", retry=tasks.RecordingTimes(
        attempts, name="r", provides="attempt", **delay))
    retried.add(tasks.FailUntil("flaky", inject={"succeed_at": succeed_at}))
    side = lf.Flow("side").add(*(tasks.Step(f"side{i}") for i in range(SIDE_STEPS)))
    return uf.Flow("root").add(retried, side)


def record_retrying(engine) -> None:
    def on_retrying(state, details):
        if details.get("retry_name") == "r":
            tasks.record("retrying", "r")

    engine.atom_notifier.register(states.RETRYING, on_retrying)


def waits(until: str | None = None) -> list[tuple[int, int]]:
    """(start, end) sequence numbers of each wait: RETRYING until the controller's next
    ``execute`` (``until``: until the next execute of that task)."""
    starts = [e["seq"] for e in tasks.entries("retrying")]
    attempts = [e["seq"] for e in (tasks.entries("retry-execute") if until is None else
                                   tasks.entries("execute")) if until in (None, e["atom"])]
    return list(zip(starts, attempts[1:]))


class SideProgress:
    """Wakes a waiting test each time a step of the side chain finishes."""

    def __init__(self, engine) -> None:
        self._done = 0
        self._changed = threading.Condition()
        engine.atom_notifier.register(states.SUCCESS, self._on_success)

    def _on_success(self, state, details) -> None:
        if str(details.get("task_name", "")).startswith("side"):
            with self._changed:
                self._done += 1
                self._changed.notify_all()

    def wait_for_steps_after(self, seq: int, count: int = 2) -> None:
        """Wait until ``count`` side steps executed after ledger entry ``seq`` (or the whole
        chain finished). A step's execute is in the ledger before its SUCCESS reaches here."""
        def moved_on() -> bool:
            after = [e for e in tasks.entries("execute")
                     if e["atom"].startswith("side") and e["seq"] > seq]
            return len(after) >= count or self._done >= SIDE_STEPS

        with self._changed:
            assert self._changed.wait_for(moved_on, 30), (
                "the side chain did not move on while the retry waited", self._done)


@pytest.mark.parametrize(
    "delay",
    [{"delay": 0.05}, {"delay": 0.02, "backoff": 2.0}, {"delay": 0.05, "backoff": 3.0,
                                                       "max_delay": 0.06}],
    ids=["fixed", "backoff", "backoff-capped"],
)
def test_other_ready_atoms_run_while_a_retry_waits(engine_factory, delay, monkeypatch):
    # The retry's clock stands still until the side chain has moved on, so the test does not
    # depend on how much the machine gets done in a short real wait.
    clock = ManualClock(time.time())
    monkeypatch.setattr(held_publishes, "CLOCK", clock)  # a worker-based engine's wait
    engine = engine_factory(delayed_flow(**delay), retry_clock=clock)
    record_retrying(engine)
    side = SideProgress(engine)
    started: queue.Queue = queue.Queue()
    engine.retry_waits.subscribe(lambda wait: started.put(wait) if wait.due else None)
    raised: list[BaseException] = []
    runner = threading.Thread(target=lambda: _run_into(engine, raised), daemon=True)
    runner.start()
    for _attempt in (2, 3):
        wait = started.get(timeout=30)
        side.wait_for_steps_after(tasks.entries("retrying")[-1]["seq"])
        clock.advance(wait.seconds)
        engine.retry_waits.timer.check()
    runner.join(30)
    assert not runner.is_alive() and not raised, raised
    assert engine.storage.get_flow_state() == states.SUCCESS
    spans = waits(until="flaky")
    assert len(spans) == 2
    side_steps = [e["seq"] for e in tasks.entries("execute") if e["atom"].startswith("side")]
    start, end = spans[0]
    # The side chain is linear: two of its steps inside the wait means one became ready and
    # was started while the retry was waiting (an engine that blocks manages none).
    assert len([seq for seq in side_steps if start < seq < end]) >= 2, (
        "the engine stopped starting ready atoms while the retry waited", spans, side_steps)


def _run_into(engine, raised: list[BaseException]) -> None:
    try:
        engine.run()
    except BaseException as err:  # reported by the test thread
        raised.append(err)


def test_attempts_happen_in_order_each_after_its_wait(engine_factory):
    engine = engine_factory(delayed_flow(attempts=4, succeed_at=4, delay=0.01, backoff=1.5))
    record_retrying(engine)
    engine.run()
    executions = [e for e in tasks.entries("execute") if e["atom"] == "flaky"]
    assert [e["attempt"] for e in executions] == [1, 2, 3, 4]
    assert [e["attempt"] for e in tasks.entries("retry-execute")] == [1, 2, 3, 4]
    assert [e["decision"] for e in tasks.entries("retry-decision")] == ["RETRY"] * 3
    for (start, end), attempt in zip(waits(), executions[1:]):
        # Each failed attempt was reverted before the wait, and the next came after it.
        assert start < end < attempt["seq"]
    reverts = [e["seq"] for e in tasks.entries("revert") if e["atom"] == "flaky"]
    assert all(r < s for r, (s, _end) in zip(reverts, waits()))


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_the_first_attempt_starts_without_waiting(engine_factory, delay):
    engine = engine_factory(delayed_flow(delay=delay))
    record_retrying(engine)
    engine.run()
    first_attempt = tasks.first_seq("retry-execute", "r")
    assert first_attempt < tasks.first_seq("retrying", "r")
    assert first_attempt < tasks.first_seq("execute", "flaky")
    assert [e["attempt"] for e in tasks.entries("execute") if e["atom"] == "flaky"] == [1, 2, 3]


def test_delayed_retry_that_gives_up_still_reverts(engine_factory):
    engine = engine_factory(delayed_flow(attempts=2, succeed_at=5, delay=0.01))
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert engine.storage.get_flow_state() == states.REVERTED
    assert [e["decision"] for e in tasks.entries("retry-decision")] == ["RETRY", "REVERT"]


@pytest.mark.parametrize("controller", [
    lambda **kw: retry.ForEach([1, 2], **kw),
    lambda **kw: retry.ParameterizedForEach(**kw),
    lambda **kw: retry.AlwaysRevert(**kw),
    lambda **kw: retry.AlwaysRevertAll(**kw),
], ids=["ForEach", "ParameterizedForEach", "AlwaysRevert", "AlwaysRevertAll"])
def test_every_controller_accepts_delay_keywords(controller):
    made = controller(name="r", delay=0.5, backoff=2.0, max_delay=1.5)
    assert [made.delay_before(n) for n in (1, 2, 3, 4)] == [0.0, 0.5, 1.0, 1.5]


@pytest.mark.parametrize("bad", [{"delay": -1}, {"backoff": 0.5}, {"max_delay": -2}])
def test_bad_delay_settings_are_refused_naming_the_retry(bad):
    with pytest.raises(ValueError, match="picky"):
        retry.Times(2, name="picky", **bad)


def retried_once(delay: float) -> lf.Flow:
    """Task "flaky" under retry "r" waiting ``delay`` before each attempt; attempt 2 succeeds."""
    flow = lf.Flow("retried", retry=tasks.RecordingTimes(3, name="r", provides="attempt",
                                                         delay=delay))
    return flow.add(tasks.FailUntil("flaky", inject={"succeed_at": 2}))


def run_until_retrying(engine) -> None:
    """Run ``engine`` and suspend it as its retry "r" starts waiting before attempt 2."""
    def suspend_when_waiting(state, details):
        if details.get("retry_name") == "r":
            engine.suspend()

    engine.atom_notifier.register(states.RETRYING, suspend_when_waiting)
    engine.run()
    engine.atom_notifier.deregister(states.RETRYING, suspend_when_waiting)


def suspended_during_a_wait(engine_factory, delay: float):
    """An engine suspended while its retry "r" waits before attempt 2 (of a flaky subflow)."""
    engine = engine_factory(retried_once(delay))
    run_until_retrying(engine)
    return engine


def flaky_attempts() -> list[int]:
    """The attempts of task "flaky" that ran."""
    return [e["attempt"] for e in tasks.entries("execute") if e["atom"] == "flaky"]


def stored_due(engine) -> float:
    """When the stored wait of retry "r" ends (seconds since the epoch)."""
    storage = engine.storage
    return storage.flow_detail.find(storage.get_atom_uuid("r")).meta[META_RETRY_DUE]


def test_suspending_during_a_wait_starts_no_new_attempt(engine_factory):
    before = time.time()
    engine = suspended_during_a_wait(engine_factory, delay=1000.0)
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert [e["attempt"] for e in tasks.entries("retry-execute")] == [1]
    # The wait's end is stored, so whoever resumes the flow knows how much of it is left.
    assert before + 1000.0 <= stored_due(engine) <= time.time() + 1000.0
    # The wait ran out while the flow was suspended: a resumed run starts attempt 2 at once.
    engine.storage.update_atom_metadata("r", {META_RETRY_DUE: time.time() - 1.0})
    engine.run()
    assert [e["attempt"] for e in tasks.entries("execute") if e["atom"] == "flaky"] == [1, 2]
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_a_resumed_flow_waits_out_what_is_left_of_the_delay(engine_factory):
    engine = suspended_during_a_wait(engine_factory, delay=1000.0)
    due = stored_due(engine)
    announced: list[float | None] = []
    started_then: list[list[int]] = []

    def suspend_once_heard(wait):
        announced.append(wait.due)
        if wait.due is not None:
            # The resumed engine waits, and attempt 2 has not started (on the worker-based
            # engine its controller ran, and its task's request is held as a delayed dispatch).
            started_then.append(flaky_attempts())
            engine.suspend()

    engine.retry_waits.subscribe(suspend_once_heard)
    engine.run()
    assert started_then == [[1]]
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert flaky_attempts() == [1]
    # Resuming did not start the wait over, and said it went on.
    assert stored_due(engine) == due
    assert announced == [due]


def test_a_wait_is_heard_only_once_it_is_armed(engine_factory, monkeypatch):
    # A hearer on another thread may move time the moment it hears of a wait (the test above
    # moves it inside the announcement). Heard before its request was held, a worker-based
    # engine's wait would be reckoned before the move and held from after it: a whole delay
    # longer, by a clock a test moves once (CI saw that request expire after 15s).
    order: list[str] = []
    arm = DelayTimer.after
    later = dd.dispatch_later

    def timer_after(timer, seconds, value):
        if seconds > 0:
            order.append("armed")
        return arm(timer, seconds, value)

    def dispatch_later(*args, **kwargs):
        order.append("armed")
        return later(*args, **kwargs)

    monkeypatch.setattr(DelayTimer, "after", timer_after)
    monkeypatch.setattr(dd, "dispatch_later", dispatch_later)
    engine = engine_factory(retried_once(0.01))
    engine.retry_waits.subscribe(
        lambda wait: order.append("heard" if wait.due is not None else "ended"))
    engine.run()
    assert flaky_attempts() == [1, 2]
    assert order[:2] == ["armed", "heard"], order


@pytest.mark.parametrize("resumed", [False, True], ids=["first-run", "resumed"])
def test_time_moved_as_a_wait_is_heard_ends_it(engine_factory, monkeypatch, resumed):
    # Whoever hears a wait may move time at once (tests do, doc/retries.rst): by then the wait
    # must be armed (a timer set, or its request held by the broker client), or a wait due by
    # the moved clock would never end.
    clock = ManualClock(time.time())
    monkeypatch.setattr(held_publishes, "CLOCK", clock)
    engine = engine_factory(retried_once(1000.0), retry_clock=clock)
    if resumed:
        run_until_retrying(engine)
        # Resumed, and suspended again while it waits (the worker-based engine's controller
        # has decided, and its task's request waits as a delayed dispatch).
        for state in engine.run_iter():
            if state == states.WAITING:
                engine.suspend()
        assert engine.storage.get_flow_state() == states.SUSPENDED
        assert flaky_attempts() == [1]

    def move_time(wait):
        if wait.due is not None:
            clock.advance(wait.seconds)
            engine.retry_waits.timer.check()

    engine.retry_waits.subscribe(move_time)
    old_job = delays.delayed_job(engine, "flaky") if resumed else None
    raised: list[BaseException] = []
    runner = threading.Thread(target=lambda: _run_into(engine, raised), daemon=True)
    runner.start()
    if delays.broker_times_delays(engine):
        # beanstalkd times the request's delay itself (the wait is heard once the request is
        # put there): no clock of ours ends it.
        delays.kick_delayed_job(engine, "flaky", old_job)
    runner.join(30)
    assert not runner.is_alive(), "the wait never ended"
    assert not raised, raised
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert flaky_attempts() == [1, 2]
