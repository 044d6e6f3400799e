"""The broker client's held requests: published when due by the clock, in due order, once;
withdrawn ones never; and which transports hold delays themselves."""

from __future__ import annotations

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine.worker_based.broker import connection as cn
from flowengine.worker_based.broker import transport_beanstalk_delays as beanstalk_delays
from flowengine.worker_based.engine_side import held_publishes as hp


def _held(clock: ManualClock) -> tuple[hp.HeldPublishes, list[str]]:
    published: list[str] = []
    held = hp.HeldPublishes(clock)
    for key, seconds in (("late", 30.0), ("soon", 10.0), ("gone", 5.0), ("mid", 20.0)):
        held.hold(key, seconds, lambda key=key: published.append(key))
    return held, published


def test_requests_are_published_when_due_in_due_order_and_once() -> None:
    clock = ManualClock()
    held, published = _held(clock)
    assert held.withdraw("gone") and not held.withdraw("gone")
    assert held.take_due() == [] and len(held) == 3
    clock.advance(20.0)
    for publish in held.take_due():
        publish()
    assert published == ["soon", "mid"] and "late" in held and "mid" not in held
    clock.advance(100.0)
    assert [p() for p in held.take_due()] == [None] and published[-1] == "late"
    assert held.take_due() == [] and len(held) == 0


def test_holding_a_key_again_replaces_the_earlier_publish() -> None:
    clock = ManualClock()
    held, published = _held(clock)
    held.hold("soon", 50.0, lambda: published.append("soon-again"))
    clock.advance(40.0)
    for publish in held.take_due():
        publish()
    assert published == ["gone", "mid", "late"]
    clock.advance(10.0)
    for publish in held.take_due():
        publish()
    assert published[-1] == "soon-again"


def test_the_module_clock_is_used_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    monkeypatch.setattr(hp, "CLOCK", clock)
    held = hp.HeldPublishes()
    held.hold("k", 1.0, lambda: None)
    assert held.take_due() == []
    clock.advance(1.0)
    assert len(held.take_due()) == 1


def test_only_beanstalkd_holds_delays_itself() -> None:
    from kombu.transport import memory

    from flowengine.worker_based.broker import transport_beanstalk, transport_fs

    assert cn.traits(transport_beanstalk.Transport).native_delay
    assert not cn.traits(memory.Transport).native_delay
    assert not cn.traits(transport_fs.Transport).native_delay


def test_a_delayed_job_handle_names_its_server() -> None:
    beanstalk_delays.record("unasked", ("10.0.0.5", 11301), 41)  # no receipt open: kept nowhere
    with beanstalk_delays.receipt() as put:
        beanstalk_delays.record("req-1", ("10.0.0.5", 11301), 42)
    job = put.handle
    assert job == "beanstalk://10.0.0.5:11301/42?attempt=req-1"
    with beanstalk_delays.receipt() as other:
        pass
    assert other.handle is None
    assert beanstalk_delays.attempt_of(job) == "req-1"
    assert beanstalk_delays.parse(job) == (("10.0.0.5", 11301), 42)
    for bad in ("redis://h:1/2", "beanstalk://h/2", "beanstalk://h:1/x"):
        with pytest.raises(ValueError, match="Not a beanstalkd job handle"):
            beanstalk_delays.parse(bad)
