"""A retry's wait on an injected clock: its due time, its events, suspend and resume.

The engine option ``retry_clock`` replaces the clock of the stored due time and of the timer,
so these tests move time by hand and call ``engine.retry_waits.timer.check()``; nothing sleeps.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from click.testing import CliRunner
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from test_events_listeners import Recorder  # tests/unit is on sys.path (pytest rootdir)

from flowengine import engines, retry, states, task
from flowengine.cli import formatting as fmt
from flowengine.cli.main import cli
from flowengine.engines.actions import META_RETRY_DUE
from flowengine.engines.delays import DelayTimer, RetryWait
from flowengine.flows import linear_flow
from flowengine.persistence import backends
from flowengine.persistence.backends import impl_memory
from flowengine.utils import persistence_utils
from flowengine.worker_based.event_listener import EventListener

START = 1_700_000_000.0
WAIT = 30.0


class FailFirst(task.Task):
    """Fails its first attempt (the retry's ``attempt`` 1), succeeds after."""

    def execute(self, attempt: int) -> int:
        if attempt == 1:
            raise RuntimeError("first attempt fails")
        return attempt


def test_the_timer_completes_a_delay_only_once_the_clock_reaches_it() -> None:
    clock = ManualClock(START)
    timer = DelayTimer(clock)
    first, second = timer.after(5.0, "first"), timer.after(9.0, "second")
    clock.advance(4.9)
    timer.check()
    assert not first.done() and not second.done()
    clock.advance(0.2)
    timer.check()
    assert first.result(timeout=0) == "first" and not second.done()
    timer.cancel_all()
    assert second.cancelled()
    assert timer.after(0, "now").result(timeout=0) == "now"


class Waiting:
    """A flow whose retry waits ``WAIT`` seconds before attempt 2, run on a manual clock."""

    def __init__(self, backend: Any = None) -> None:
        self.clock = ManualClock(START)
        self.backend = backend or impl_memory.MemoryBackend()
        flow = linear_flow.Flow("f", retry=retry.Times(3, name="r", provides="attempt",
                                                        delay=WAIT))
        self.flow = flow.add(FailFirst("flaky"))
        _book, self.detail = persistence_utils.temporary_flow_detail(self.backend)
        self.sink = Recorder()
        self.delayed = threading.Event()

    def engine(self) -> Any:
        engine = engines.load(self.flow, flow_detail=self.detail, backend=self.backend,
                              retry_clock=self.clock)
        engine.retry_waits.subscribe(
            lambda wait: self.delayed.set() if wait.due is not None else None)
        return engine

    def due(self, engine: Any) -> Any:
        uuid = engine.storage.get_atom_uuid("r")
        return engine.storage.flow_detail.find(uuid).meta.get(META_RETRY_DUE)

    def run_in_thread(self, engine: Any) -> threading.Thread:
        def run() -> None:
            with EventListener(engine, self.sink):
                engine.run()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert self.delayed.wait(30), "the retry never started its wait"
        return thread


def test_a_wait_is_stored_announced_and_ends_when_the_clock_is_due() -> None:
    waiting = Waiting()
    engine = waiting.engine()
    thread = waiting.run_in_thread(engine)
    assert waiting.due(engine) == START + WAIT
    assert engine.storage.get_atom_state("r") == states.RETRYING
    delayed = dict(waiting.sink.events)["task-delayed"]
    assert (delayed["task_name"], delayed["kind"], delayed["attempt"]) == ("r", "retry", 2)
    assert (delayed["delay"], delayed["due"]) == (WAIT, START + WAIT)
    waiting.clock.advance(WAIT - 1)
    engine.retry_waits.timer.check()
    assert engine.storage.get_atom_state("flaky") == states.PENDING  # not yet
    waiting.clock.advance(1)
    engine.retry_waits.timer.check()
    thread.join(30)
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert engine.storage.get("flaky") == 2
    assert waiting.due(engine) is None  # over: nothing shows it delayed any more
    types = waiting.sink.types()
    assert types.index("task-retried") < types.index("task-delayed") < types.index(
        "task-delay-ended")
    ended = dict(waiting.sink.events)["task-delay-ended"]
    assert (ended["task_name"], ended["attempt"]) == ("r", 2)


def test_a_flow_suspended_in_a_wait_resumes_with_what_is_left() -> None:
    waiting = Waiting()
    engine = waiting.engine()
    thread = waiting.run_in_thread(engine)
    waiting.clock.advance(10)
    engine.suspend()
    thread.join(30)
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert waiting.due(engine) == START + WAIT  # kept for whoever resumes the flow

    # Another engine (another process, as after a crash) loads the stored flow.
    waiting.delayed.clear()
    waiting.sink.events.clear()
    resumed = waiting.engine()
    thread = waiting.run_in_thread(resumed)
    delayed = dict(waiting.sink.events)["task-delayed"]
    assert (delayed["delay"], delayed["due"]) == (WAIT - 10, START + WAIT)
    waiting.clock.advance(WAIT - 10)
    resumed.retry_waits.timer.check()
    thread.join(30)
    assert resumed.storage.get_flow_state() == states.SUCCESS
    assert resumed.storage.get("flaky") == 2


def test_the_same_engine_run_again_announces_each_wait_once() -> None:
    # Each run's listener stops observing the waits when it is done: a listener of an earlier
    # run still subscribed would announce the resumed wait a second time.
    waiting = Waiting()
    engine = waiting.engine()
    thread = waiting.run_in_thread(engine)
    engine.suspend()
    thread.join(30)
    assert engine.storage.get_flow_state() == states.SUSPENDED
    waiting.delayed.clear()
    waiting.sink.events.clear()
    thread = waiting.run_in_thread(engine)
    waiting.clock.advance(WAIT)
    engine.retry_waits.timer.check()
    thread.join(30)
    assert engine.storage.get_flow_state() == states.SUCCESS
    types = waiting.sink.types()
    assert (types.count("task-delayed"), types.count("task-delay-ended")) == (1, 1), types


def test_an_observer_that_raises_does_not_stop_the_flow() -> None:
    waiting = Waiting()
    engine = waiting.engine()

    def broken(wait: RetryWait) -> None:
        raise RuntimeError("sink down")

    engine.retry_waits.subscribe(broken)
    thread = waiting.run_in_thread(engine)
    waiting.clock.advance(WAIT)
    engine.retry_waits.timer.check()
    thread.join(30)
    assert engine.storage.get_flow_state() == states.SUCCESS


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_every_local_engine_takes_the_clock(kind: str) -> None:
    waiting = Waiting()
    engine = engines.load(waiting.flow, flow_detail=waiting.detail, backend=waiting.backend,
                          engine=kind, retry_clock=waiting.clock)
    engine.retry_waits.subscribe(
        lambda wait: waiting.delayed.set() if wait.due is not None else None)
    thread = waiting.run_in_thread(engine)
    assert waiting.due(engine) == START + WAIT
    waiting.clock.advance(WAIT)
    engine.retry_waits.timer.check()
    thread.join(30)
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_show_tells_when_a_waiting_retry_is_due(tmp_path: Any) -> None:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    backend = backends.fetch(uri)
    backend.get_connection().upgrade()
    waiting = Waiting(backend)
    engine = waiting.engine()
    thread = waiting.run_in_thread(engine)
    engine.suspend()
    thread.join(30)
    result = CliRunner().invoke(cli, ["show", waiting.detail.uuid, "--backend", uri],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    header, *rows = [line.split() for line in result.stdout.splitlines()
                     if line.startswith(("ATOM", "r ", "flaky "))]
    at = header.index("DELAYED")  # the title "DELAYED UNTIL" is two words
    by_atom = {row[0]: row for row in rows}
    assert by_atom["r"][2] == states.RETRYING
    assert by_atom["r"][at] == fmt.timestamp(START + WAIT)
    assert by_atom["flaky"][at] == "-"


def test_a_wait_that_ran_out_while_suspended_ends_at_once_on_resume() -> None:
    waiting = Waiting()
    engine = waiting.engine()
    thread = waiting.run_in_thread(engine)
    engine.suspend()
    thread.join(30)
    waiting.clock.advance(WAIT + 1)  # the flow stayed suspended past the due time
    resumed = waiting.engine()
    with EventListener(resumed, waiting.sink):
        resumed.run()  # nothing to wait for: no check() needed
    assert resumed.storage.get_flow_state() == states.SUCCESS
    assert waiting.due(resumed) is None
    ended = [fields for kind, fields in waiting.sink.events if kind == "task-delay-ended"]
    assert [e["attempt"] for e in ended] == [2]

