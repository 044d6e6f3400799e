"""Tests for flowengine.types.notifier."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from flowengine.types.notifier import Listener, Notifier, RestrictedNotifier, register_deregister


class Recorder:
    """A callback that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, event_type: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((event_type, args, kwargs))


def test_callback_gets_event_args_and_details_as_keyword() -> None:
    notifier = Notifier()
    rec = Recorder()
    notifier.register("SUCCESS", rec, args=[1, 2], kwargs={"k": "v"})
    notifier.notify("SUCCESS", {"result": 5})
    assert rec.calls == [("SUCCESS", (1, 2), {"k": "v", "details": {"result": 5}})]


def test_taskflow_style_callback_signature() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def on_event(state: str, details: dict[str, Any]) -> None:
        seen.append((state, details))

    notifier = Notifier()
    notifier.register(Notifier.ANY, on_event)
    notifier.notify("RUNNING", None)
    assert seen == [("RUNNING", {})]


def test_each_callback_gets_its_own_copy_of_details() -> None:
    notifier = Notifier()

    def mutate(event_type: str, details: dict[str, Any]) -> None:
        details["mutated"] = True

    rec = Recorder()
    notifier.register("E", mutate)
    notifier.register("E", rec)
    details = {"a": 1}
    notifier.notify("E", details)
    assert rec.calls[0][2]["details"] == {"a": 1}
    assert details == {"a": 1}


def test_any_listeners_run_first_and_any_cannot_be_notified() -> None:
    notifier = Notifier()
    order: list[str] = []
    notifier.register("E", lambda e, details: order.append("specific"))
    notifier.register(Notifier.ANY, lambda e, details: order.append("any"))
    notifier.notify("E", {})
    assert order == ["any", "specific"]
    notifier.notify(Notifier.ANY, {})
    assert order == ["any", "specific"]


def test_raising_callback_is_logged_and_isolated(caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier()

    def broken(event_type: str, details: dict[str, Any]) -> None:
        raise RuntimeError("listener bug")

    rec = Recorder()
    notifier.register("E", broken)
    notifier.register("E", rec)
    with caplog.at_level(logging.WARNING, logger="flowengine.types.notifier"):
        notifier.notify("E", {"x": 1})
    assert len(rec.calls) == 1
    [record] = caplog.records
    assert "broken" in record.getMessage() and "'E'" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


def test_details_filter() -> None:
    notifier = Notifier()
    rec = Recorder()

    def only_big(details: dict[str, Any]) -> bool:
        return bool(details.get("size", 0) > 10)

    notifier.register("E", rec, details_filter=only_big)
    notifier.notify("E", {"size": 1})
    notifier.notify("E", {"size": 11})
    assert [c[2]["details"]["size"] for c in rec.calls] == [11]
    assert notifier.is_registered("E", rec, details_filter=only_big)
    assert not notifier.is_registered("E", rec)


def test_register_validation() -> None:
    notifier = Notifier()
    rec = Recorder()
    with pytest.raises(ValueError, match="not callable"):
        notifier.register("E", "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Details filter"):
        notifier.register("E", rec, details_filter=3)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="details"):
        notifier.register("E", rec, kwargs={"details": 1})
    notifier.register("E", rec)
    with pytest.raises(ValueError, match="already registered"):
        notifier.register("E", rec)
    assert len(notifier) == 1


def test_bound_methods_are_equivalent_across_accesses() -> None:
    class Owner:
        def on(self, event_type: str, details: dict[str, Any]) -> None:
            pass

    a, b = Owner(), Owner()
    notifier = Notifier()
    notifier.register("E", a.on)
    assert notifier.is_registered("E", a.on)
    assert not notifier.is_registered("E", b.on)
    assert notifier.deregister("E", a.on)
    assert len(notifier) == 0


def test_deregister_reset_and_listeners_iter() -> None:
    notifier = Notifier()
    r1, r2 = Recorder(), Recorder()
    notifier.register("A", r1)
    notifier.register("A", r2)
    notifier.register("B", r1)
    assert len(notifier) == 3
    assert not notifier.deregister("C", r1)
    assert notifier.deregister("A", r1)
    assert not notifier.deregister("A", r1)
    assert {event: [ls.callback for ls in listeners]
            for event, listeners in notifier.listeners_iter()} == {"A": [r2], "B": [r1]}
    assert notifier.deregister_event("A") == 1
    assert notifier.deregister_event("A") == 0
    notifier.reset()
    assert len(notifier) == 0


def test_copy_is_independent() -> None:
    notifier = RestrictedNotifier(["A"])
    rec = Recorder()
    notifier.register("A", rec)
    clone = notifier.copy()
    assert isinstance(clone, RestrictedNotifier)
    clone.deregister("A", rec)
    assert len(notifier) == 1 and len(clone) == 0
    with pytest.raises(ValueError):
        clone.register("B", rec)


def test_restricted_notifier() -> None:
    notifier = RestrictedNotifier(["A", "B"], allow_any=False)
    assert sorted(notifier.events_iter()) == ["A", "B"]
    assert notifier.can_be_registered("A")
    assert not notifier.can_be_registered(Notifier.ANY)
    with pytest.raises(ValueError, match="'C'"):
        notifier.register("C", Recorder())
    assert RestrictedNotifier(["A"]).can_be_registered(Notifier.ANY)


def test_register_deregister_context_manager() -> None:
    notifier = Notifier()
    rec = Recorder()
    with register_deregister(notifier, "E", rec, args=["x"]):
        assert notifier.is_registered("E", rec)
        notifier.notify("E", {})
    assert not notifier.is_registered("E", rec)
    assert rec.calls == [("E", ("x",), {"details": {}})]
    with register_deregister(notifier, "E", None):
        assert len(notifier) == 0
    with pytest.raises(RuntimeError), register_deregister(notifier, "E", rec):
        raise RuntimeError("body failed")
    assert len(notifier) == 0


def test_listener_holder() -> None:
    rec = Recorder()
    listener = Listener(rec, args=(1,), kwargs={"k": 2})
    assert listener.args == (1,)
    kwargs = listener.kwargs
    kwargs["k"] = 99
    assert listener.kwargs == {"k": 2}
    assert listener == Listener(rec)
    assert listener != Listener(Recorder())
    listener("E", {"d": 1})
    assert rec.calls == [("E", (1,), {"k": 2, "details": {"d": 1}})]


def test_registration_is_thread_safe_while_notifying() -> None:
    notifier = Notifier()
    stop = threading.Event()
    errors: list[BaseException] = []

    def notify_loop() -> None:
        try:
            while not stop.is_set():
                notifier.notify("E", {})
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    thread = threading.Thread(target=notify_loop)
    thread.start()
    callbacks = [Recorder() for _ in range(300)]
    for cb in callbacks:
        notifier.register("E", cb)
    for cb in callbacks:
        assert notifier.deregister("E", cb)
    stop.set()
    thread.join()
    assert errors == []
    assert len(notifier) == 0


def test_concurrent_duplicate_registration_admits_exactly_one() -> None:
    notifier = Notifier()
    rec = Recorder()
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def register() -> None:
        barrier.wait()
        try:
            notifier.register("E", rec)
            outcomes.append("ok")
        except ValueError:
            outcomes.append("dup")

    threads = [threading.Thread(target=register) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["dup"] * 7 + ["ok"]
    assert len(notifier) == 1
