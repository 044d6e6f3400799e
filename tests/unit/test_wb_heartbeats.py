"""The worker's heartbeat thread: one thread beats for every running request."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from flowengine.worker_based.worker_side.heartbeats import Heartbeats

WAIT = 10.0
LONG = 3600.0  # an interval no test outlives


class CountingCondition(threading.Condition):
    """A condition that counts how often waiters were notified."""

    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


@pytest.fixture
def beats() -> Iterator[Heartbeats]:
    heartbeats = Heartbeats()
    heartbeats._cond = CountingCondition()
    yield heartbeats
    for key in list(heartbeats._due):
        heartbeats.remove(key)


def _waiting(beats: Heartbeats) -> bool:
    with beats._cond:
        return beats._wake_at != float("-inf")


def _wait_until_waiting(beats: Heartbeats) -> None:
    # The thread says it waits (_wake_at) under the condition it then waits on; poll that.
    deadline = time.monotonic() + WAIT
    pause = threading.Event()  # never set: a bounded pause between looks
    while not _waiting(beats):
        assert time.monotonic() < deadline, "the heartbeat thread never waited"
        pause.wait(0.001)


def test_each_key_beats_at_its_interval_until_removed(beats: Heartbeats) -> None:
    beat = threading.Event()
    beats.add("a", 0.01, beat.set)
    assert beat.wait(WAIT)
    beats.remove("a")
    beat.clear()
    assert not beat.wait(0.05)  # removed: no more beats (it returns only once none is sending)


def test_a_sooner_beat_wakes_the_thread_and_a_later_one_does_not(
    beats: Heartbeats,
) -> None:
    beats.add("long", LONG, lambda: None)
    _wait_until_waiting(beats)
    notified = beats._cond.notified
    for i in range(100):  # later than what the thread waits for: it need not wake up
        beats.add(f"later-{i}", LONG + 1, lambda: None)
    assert beats._cond.notified == notified
    soon = threading.Event()
    beats.add("soon", 0.01, soon.set)  # sooner: without a wake-up it would beat in an hour
    assert beats._cond.notified == notified + 1
    assert soon.wait(WAIT)
