"""``flowengine events`` prints events in the order they happened, not the order they came."""

from __future__ import annotations

import pytest
from manual_clock import ManualClock

from flowengine.cli.event_order import TimeOrder


def _event(name: str, stamp: float | None) -> dict[str, object]:
    return {"type": name} if stamp is None else {"type": name, "timestamp": stamp}


def test_an_event_arriving_late_within_the_window_takes_its_place() -> None:
    clock = ManualClock()
    order = TimeOrder(window=0.3, clock=clock)
    order.add(_event("task-succeeded", 100.2))  # the engine's, published at once
    clock.advance(0.1)
    order.add(_event("task-started", 100.1))  # the worker's, batched, arrives later
    assert order.release() == []  # held: nothing is due yet
    assert order.wait() == pytest.approx(0.2)
    clock.advance(0.2)
    assert [e["type"] for e in order.release()] == ["task-started", "task-succeeded"]
    assert order.wait() is None


def test_nothing_released_later_is_older_than_what_was_released() -> None:
    clock = ManualClock()
    order = TimeOrder(window=0.3, clock=clock)
    order.add(_event("a", 10.0))
    clock.advance(0.2)
    order.add(_event("c", 12.0))
    order.add(_event("b", 9.0))  # older than "a": released with it
    clock.advance(0.1)
    assert [e["type"] for e in order.release()] == ["b", "a"]
    clock.advance(0.2)
    assert [e["type"] for e in order.release()] == ["c"]


def test_events_without_a_timestamp_keep_their_place_and_drain_releases_all() -> None:
    clock = ManualClock()
    order = TimeOrder(window=5.0, clock=clock)
    for event in (_event("x", 1.0), _event("y", None), _event("z", 0.5)):
        order.add(event)
    assert [e["type"] for e in order.drain()] == ["z", "x", "y"]
    assert order.drain() == [] and order.wait() is None


def test_a_zero_window_releases_each_event_as_it_comes() -> None:
    order = TimeOrder(window=0.0, clock=ManualClock())
    order.add(_event("b", 2.0))
    assert [e["type"] for e in order.release()] == ["b"]
