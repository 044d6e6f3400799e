"""A task's ``start_delay`` (a flowengine extension): each execution waits after the task is ready.

Nothing here waits the delay: the engine's clock (option ``retry_clock``, and the clock a
worker-based engine's held requests are due by) stands still until the test moves it; where
the broker holds the delay itself (beanstalkd, in the suite on real brokers) the test ends the
job's delay with ``kick-job``. A side
chain of steps runs while the delayed task waits, which shows the wait blocks nothing else.
Local engines keep the task PENDING during the wait; the worker-based engine sends its request
at once as a delayed dispatch (RUNNING with ``delayed_until``), see doc/priorities.rst.
"""

from __future__ import annotations

import queue
import threading
import time

from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine import states
from flowengine.engines.actions import META_ATTEMPT_IDS, META_DELAYED_JOB, META_DELAYED_UNTIL
from flowengine.engines.delays import RetryWait
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based.engine_side import held_publishes

from . import delays, tasks

DELAY = 600.0
SIDE_STEPS = 5


def delayed_flow() -> uf.Flow:
    late = tasks.Step("late")
    late.start_delay = DELAY  # engine-side only: workers run the plain Step
    side = lf.Flow("side").add(*(tasks.Step(f"side{i}") for i in range(SIDE_STEPS)))
    return uf.Flow("root").add(lf.Flow("waits").add(late, tasks.Step("after")), side)


def _run_into(engine, raised: list[BaseException]) -> None:
    try:
        engine.run()
    except BaseException as err:  # reported by the test thread
        raised.append(err)


def _meta(engine, name: str) -> dict:
    storage = engine.storage
    return storage.flow_detail.find(storage.get_atom_uuid(name)).meta


def _end_wait(engine, clock: ManualClock, seconds: float, old_job: object = None) -> None:
    """Move the engine's clock past the wait of task "late" (and kick its job on a broker that
    holds delays itself: ``old_job`` is the handle of an earlier run's job, taken back, which
    is not the one to kick)."""
    native = delays.broker_times_delays(engine)
    executor = getattr(engine, "worker_executor", None)
    if executor is not None and not native:
        # The client holds the request, due by the clock when it was held: it must be held
        # before the clock moves (announced is not enough: a worker may not be known yet).
        deadline = time.monotonic() + 30
        while not any(rid in executor.client.held
                      for rid in _meta(engine, "late").get(META_ATTEMPT_IDS) or ()):
            assert time.monotonic() < deadline, "the delayed request was never held"
            time.sleep(0.01)
    clock.advance(seconds)
    engine.retry_waits.timer.check()
    if native:
        delays.kick_delayed_job(engine, "late", old_job)


def _executed() -> list[str]:
    return [e["atom"] for e in tasks.entries("execute")]


def test_a_task_starts_after_its_start_delay_and_nothing_else_waits(engine_factory,
                                                                     monkeypatch):
    clock = ManualClock(time.time())
    monkeypatch.setattr(held_publishes, "CLOCK", clock)
    engine = engine_factory(delayed_flow(), retry_clock=clock)
    waits: queue.Queue[RetryWait] = queue.Queue()
    engine.retry_waits.subscribe(waits.put)
    raised: list[BaseException] = []
    runner = threading.Thread(target=_run_into, args=(engine, raised), daemon=True)
    runner.start()
    started = waits.get(timeout=30)
    assert (started.retry_name, started.kind, started.seconds) == ("late", "task", DELAY)
    assert started.due is not None and abs(started.due - (clock() + DELAY)) < 1.0
    # The whole side chain runs while "late" waits.
    deadline = time.monotonic() + 30
    while _executed().count("late") == 0 and len(
            [a for a in _executed() if a.startswith("side")]) < SIDE_STEPS:
        assert time.monotonic() < deadline, _executed()
        time.sleep(0.01)
    assert "late" not in _executed()
    assert _meta(engine, "late")[META_DELAYED_UNTIL] == started.due
    _end_wait(engine, clock, DELAY)
    runner.join(30)
    assert not runner.is_alive() and not raised, raised
    assert engine.storage.get_flow_state() == states.SUCCESS
    order = _executed()
    assert order.index("late") < order.index("after")
    assert all(order.index(f"side{i}") < order.index("late") for i in range(SIDE_STEPS))
    ended = waits.get(timeout=30)
    assert (ended.retry_name, ended.kind, ended.due) == ("late", "task", None)


def test_a_suspended_start_delay_goes_on_with_what_is_left(engine_factory, monkeypatch):
    clock = ManualClock(time.time())
    monkeypatch.setattr(held_publishes, "CLOCK", clock)
    late = tasks.Step("late")
    late.start_delay = DELAY
    engine = engine_factory(lf.Flow("waits").add(late), retry_clock=clock)
    announced: list[RetryWait] = []

    def on_wait(wait: RetryWait) -> None:
        announced.append(wait)
        if wait.due is not None and len(announced) == 1:
            threading.Thread(target=engine.suspend, daemon=True).start()

    engine.retry_waits.subscribe(on_wait)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert "late" not in _executed()
    due = announced[0].due
    assert due is not None
    # Half the wait passes while nothing runs the flow; a resumed run waits the rest.
    old_job = _meta(engine, "late").get(META_DELAYED_JOB)
    clock.advance(DELAY / 2)
    raised: list[BaseException] = []
    runner = threading.Thread(target=_run_into, args=(engine, raised), daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while len(announced) < 2:
        assert time.monotonic() < deadline, announced
        time.sleep(0.01)
    assert announced[1].due == due and abs(announced[1].seconds - DELAY / 2) < 1.0
    assert "late" not in _executed()
    _end_wait(engine, clock, DELAY / 2, old_job)
    runner.join(30)
    assert not runner.is_alive() and not raised, raised
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert _executed() == ["late"]


def test_a_start_delay_is_armed_before_it_is_announced(local_engine_factory):
    # Whoever hears of the wait may move the clock it is due by at once (here, on the engine's
    # own thread, inside the announcement): the wait was armed from the clock before the move,
    # so the move ends it. Armed after announcing, it would count from the moved clock.
    clock = ManualClock(time.time())
    late = tasks.Step("late")
    late.start_delay = DELAY
    engine = local_engine_factory(lf.Flow("waits").add(late), retry_clock=clock)
    announced: queue.Queue[RetryWait] = queue.Queue()

    def on_wait(wait: RetryWait) -> None:
        if wait.due is not None:
            clock.advance(DELAY)
        announced.put(wait)

    engine.retry_waits.subscribe(on_wait)
    raised: list[BaseException] = []
    runner = threading.Thread(target=_run_into, args=(engine, raised), daemon=True)
    runner.start()
    assert announced.get(timeout=30).due is not None
    engine.retry_waits.timer.check()
    runner.join(30)
    assert not runner.is_alive() and not raised, raised
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert _executed() == ["late"]
