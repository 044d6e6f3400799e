"""Engines set up (compile, prepare, validate) a few at a time; the rest wait asleep."""

from __future__ import annotations

import gc
import os
import select
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flowengine import engines, exceptions, task
from flowengine.engines import setup_slots
from flowengine.flows import linear_flow as lf

WAIT = 10.0  # seconds a test waits for something that should happen at once
HOLD = 60.0  # seconds a held set-up waits for its release (longer than any WAIT)


class Noop(task.Task):
    def execute(self) -> None:
        return None


class Turnstile:
    """Counts the set-ups inside a compilation and holds them there until released."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.inside = 0
        self.most = 0
        self.released = False

    def visit(self) -> None:
        with self.cond:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: self.released, HOLD)
            self.inside -= 1

    def wait_inside(self, count: int, timeout: float = WAIT) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.inside >= count, timeout)

    def release(self) -> None:
        with self.cond:
            self.released = True
            self.cond.notify_all()


class HookedFlow(lf.Flow):
    """A linear flow that calls ``hook`` while it is being compiled."""

    def __init__(self, name: str, hook: Any) -> None:
        super().__init__(name)
        self._hook = hook

    def iter_links(self) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
        self._hook()
        yield from super().iter_links()


class HeldFlow(lf.Flow):
    """A linear flow whose compilation passes through a turnstile."""

    def __init__(self, name: str, turnstile: Turnstile) -> None:
        super().__init__(name)
        self._turnstile = turnstile

    def iter_links(self) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
        self._turnstile.visit()
        yield from super().iter_links()


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def run_held(slots: int, **load: Any) -> None:
    """Run ``slots + 3`` engines whose set-ups are held: exactly ``slots`` get in at once."""
    turnstile = Turnstile()
    flows = [HeldFlow(f"f{i}", turnstile).add(Noop(f"t{i}")) for i in range(slots + 3)]
    runs = [engines.load(flow, **load) for flow in flows]
    errors: list[BaseException] = []

    def run(engine: Any) -> None:
        try:
            engine.run()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=run, args=(e,), daemon=True) for e in runs]
    for thread in threads:
        thread.start()
    assert turnstile.wait_inside(slots)
    # The others are queued for a slot: none gets in while the slots are held. (Waiting for
    # nothing to happen is the only way to see it; without the slots they enter at once.)
    assert not turnstile.wait_inside(slots + 1, timeout=0.25)
    assert turnstile.most == slots
    turnstile.release()
    for thread in threads:
        thread.join(WAIT)
    assert not errors
    assert [e.storage.get_flow_state() for e in runs] == ["SUCCESS"] * len(runs)
    assert turnstile.most == slots


def test_in_memory_engines_set_up_one_at_a_time_and_all_finish() -> None:
    run_held(setup_slots.SLOTS)


def test_engines_storing_in_a_database_set_up_in_a_wider_pool(tmp_path: Any) -> None:
    # Their prepare waits on I/O: one on a slow database must not hold up every other.
    run_held(setup_slots.IO_SLOTS, backend=f"sqlite:///{tmp_path / 'flows.db'}")


def test_a_failed_set_up_gives_its_slot_back() -> None:
    for i in range(setup_slots.SLOTS + 2):
        flow = lf.Flow(f"bad{i}").add(Noop("same"), Noop("same"))
        with pytest.raises(exceptions.Duplicate):
            engines.load(flow).run()
    engine = engines.load(lf.Flow("good").add(Noop("t")))
    engine.run()
    assert engine.storage.get_flow_state() == "SUCCESS"


def test_nested_set_up_in_one_thread_never_waits_on_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One slot: validate -> prepare -> compile, and an engine set up from inside another's
    # set-up, would deadlock if each asked for a slot of its own.
    monkeypatch.setattr(setup_slots, "_slots", threading.BoundedSemaphore(1))
    inner = engines.load(lf.Flow("inner").add(Noop("i")))
    outer = engines.load(HookedFlow("outer", inner.validate).add(Noop("o")))
    done = threading.Event()

    def run() -> None:
        outer.run()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(WAIT), "nested set-ups waited on their own slot"
    assert outer.storage.get_flow_state() == "SUCCESS"
    assert inner.compilation.declared  # set up from inside the outer set-up


def test_the_collector_is_paused_during_set_up_and_resumed_after() -> None:
    gc.enable()
    seen: list[bool] = []
    engine = engines.load(HookedFlow("f", lambda: seen.append(gc.isenabled())).add(Noop("t")))
    engine.run()
    assert seen == [False]
    assert gc.isenabled()


def test_a_child_forked_while_a_set_up_holds_the_slot_sets_up_its_own_engines() -> None:
    gc.enable()
    turnstile = Turnstile()
    held = engines.load(HeldFlow("held", turnstile).add(Noop("h")))
    thread = threading.Thread(target=held.run, daemon=True)
    thread.start()
    try:
        assert turnstile.wait_inside(1)
        assert not gc.isenabled()  # paused by the held set-up
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only this thread; the parent's holder does not exist here
            code = 1
            try:
                engine = engines.load(lf.Flow("child").add(Noop("c")))
                engine.run()
                if engine.storage.get_flow_state() == "SUCCESS" and gc.isenabled():
                    code = 0
            finally:
                os.write(write, bytes([code]))
                os._exit(code)
        os.close(write)
        try:
            with os.fdopen(read, "rb") as answer:
                ready = select.select([answer], [], [], WAIT)[0]
                assert ready, "the forked child's engine never finished setting up"
                assert answer.read(1) == b"\x00", "the child's engine failed or left gc off"
        finally:
            if os.waitpid(pid, os.WNOHANG) == (0, 0):  # still running: stuck, so stop it
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    finally:
        turnstile.release()
        thread.join(WAIT)
    assert held.storage.get_flow_state() == "SUCCESS"
    assert gc.isenabled()
