"""The event stream's parts: scrubbing, the Lamport clock, the bounded outbox, publish and receive.

Publishing and receiving run over kombu's in-process ``memory`` transport; the outbox's queue
bound is tested with a broadcast stub that blocks until the test lets it go.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from flowengine.types.failure import Failure
from flowengine.worker_based import client as cl
from flowengine.worker_based import event_outbox as eo
from flowengine.worker_based import events as ev
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import signing as sg

WAIT = 10.0


@pytest.fixture
def exchange() -> str:
    return f"events-{uuid.uuid4().hex[:8]}"


class Listening:
    """An EventReceiver reading on a thread; events land in ``events``."""

    def __init__(self, receiver: ev.EventReceiver) -> None:
        self.events: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(receiver,), daemon=True)

    def _run(self, receiver: ev.EventReceiver) -> None:
        for event in receiver.iter(ready=self._ready.set, stop=self._stop):
            with self.arrived:
                self.events.append(event)
                self.arrived.notify_all()

    def __enter__(self) -> Listening:
        self._thread.start()
        assert self._ready.wait(WAIT), "receiver never became ready"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT)

    def wait_for(self, count: int) -> list[dict[str, Any]]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.events) >= count, WAIT), self.events
            return list(self.events)


@pytest.fixture
def listening(exchange: str) -> Iterator[Listening]:
    with Listening(ev.EventReceiver(exchange, transport="memory")) as listener:
        yield listener


# -- scrubbing ----------------------------------------------------------------------------------


def test_scrub_drops_task_data_and_masks_urls() -> None:
    fields = {
        "arguments": {"password": "s3cret"}, "result": 42, "kwargs": {"a": 1},
        "exception": "cannot reach amqp://guest:s3cret@rabbit:5672// (refused)",
        "nested": {"store": {"x": 1}, "url": "redis://:pw@h:6379/0", "ok": [1, 2.5, None, True]},
        "obj": object(),
    }
    out = ev.scrub(fields)
    assert out == {
        "exception": "cannot reach amqp://guest:***@rabbit:5672// (refused)",
        "nested": {"url": "redis://:***@h:6379/0", "ok": [1, 2.5, None, True]},
        "obj": "<object>",
    }


def test_scrub_reduces_a_failure_to_type_and_message() -> None:
    try:
        raise ValueError("bad postgresql://app:pw@db/prod")
    except ValueError:
        failure = Failure()
    assert ev.scrub({"failure": failure}) == {
        "failure": {"exc_type": "ValueError", "exception": "bad postgresql://app:***@db/prod"}}


def test_scrub_bounds_long_text() -> None:
    assert len(ev.scrub("x" * 10_000)) == ev.MAX_TEXT


# -- the clock ----------------------------------------------------------------------------------


def test_lamport_clock_forwards_and_merges() -> None:
    clock = ev.LamportClock()
    assert [clock.forward(), clock.forward()] == [1, 2]
    assert clock.adjust(10) == 11
    assert clock.adjust(3) == 12  # an older time still moves it on
    assert clock.adjust("junk") == 13
    assert clock.forward() == 14


# -- publishing and receiving -------------------------------------------------------------------


def test_published_events_arrive_celery_shaped(exchange: str, listening: Listening) -> None:
    publisher = ev.EventPublisher(exchange, transport="memory")
    before = time.time()
    publisher.emit("task-started", flow_uuid="f1", task_name="a", attempt=1)
    publisher.emit("task-succeeded", flow_uuid="f1", task_name="a", runtime=0.5,
                   result="must not travel")
    first, second = listening.wait_for(2)
    assert first["type"] == "task-started" and second["type"] == "task-succeeded"
    for event in (first, second):
        assert set(event) >= {"type", "hostname", "pid", "clock", "timestamp", "utcoffset",
                              "flow_uuid", "task_name"}
        assert before <= event["timestamp"] <= time.time()
        assert isinstance(event["utcoffset"], int)
    assert second["clock"] > first["clock"]
    assert second["runtime"] == 0.5 and "result" not in second


def test_receiver_filters_by_type_prefix_and_flow(exchange: str) -> None:
    receiver = ev.EventReceiver(exchange, transport="memory", types=["task-", "flow-failed"],
                                flow="f1")
    publisher = ev.EventPublisher(exchange, transport="memory")
    with Listening(receiver) as listener:
        publisher.emit("worker-heartbeat", worker="w")
        publisher.emit("task-started", flow_uuid="f2")
        publisher.emit("flow-succeeded", flow_uuid="f1")
        publisher.emit("task-started", flow_uuid="f1")
        publisher.emit("flow-failed", flow_uuid="f1")
        events = listener.wait_for(2)
        assert publisher.flush(WAIT)
    assert [e["type"] for e in events] == ["task-started", "flow-failed"]


def test_a_stopped_receiver_leaves_no_queue_behind(exchange: str) -> None:
    publisher = ev.EventPublisher(exchange, transport="memory")
    with Listening(ev.EventReceiver(exchange, transport="memory")) as listener:
        publisher.emit("task-sent")
        listener.wait_for(1)
    from kombu.transport.memory import Transport

    table = Transport.global_state.exchanges[ev.events_exchange(exchange)]["table"]
    assert table == []


def test_events_of_one_process_arrive_in_clock_order(exchange: str, listening: Listening) -> None:
    publishers = [ev.EventPublisher(exchange, transport="memory") for _ in range(3)]
    threads = [threading.Thread(target=lambda p=p: [p.emit("task-sent", n=n) for n in range(50)])
               for p in publishers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    events = listening.wait_for(150)
    clocks = [e["clock"] for e in events]
    assert clocks == sorted(clocks) and len(set(clocks)) == 150


def test_emit_never_raises_or_waits_for_room_when_the_broker_is_away() -> None:
    # A full queue drops its oldest event rather than make emit wait for the broker. (What an
    # emit costs is measured by benchmarks/events_cost.py, never timed here.)
    publisher = ev.EventPublisher(f"nowhere-{uuid.uuid4().hex[:8]}",
                                  url="redis://127.0.0.1:1/0", maxsize=10)
    for n in range(1000):
        publisher.emit("task-sent", n=n, weird=object())
    assert publisher.dropped >= 1000 - 2 * 10, "emit waited for room instead of dropping"
    assert publisher.flush(WAIT)
    assert publisher.published == 0


# -- the bounded outbox -------------------------------------------------------------------------


class BlockingBroadcast:
    """Publishes into a list, but only once ``release`` is set."""

    where = "stub"

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.bodies: list[Any] = []

    def publish(self, bodies: Any) -> None:
        self.entered.set()
        assert self.release.wait(WAIT)
        self.bodies.extend(bodies)

    def close(self) -> None:
        pass


def test_a_full_outbox_drops_the_oldest_and_counts_them() -> None:
    broadcast = BlockingBroadcast()
    box = eo.EventOutbox(broadcast, maxsize=5)
    box.put("first", {})
    # The publishing thread took "first" and now blocks in publish: the next ones wait.
    assert broadcast.entered.wait(WAIT)
    for n in range(12):
        box.put("task-sent", {"n": n})
    assert box.dropped == 7
    broadcast.release.set()
    assert box.flush(WAIT)
    events = [e for body in broadcast.bodies for e in (body if isinstance(body, list) else [body])]
    assert [e.get("n") for e in events] == [None, 7, 8, 9, 10, 11]
    assert box.published == 6


# -- the outbox belongs to the broker client ---------------------------------------------------


def _destination(exchange: str) -> cl.Broker:
    """The identity of the client publishing ``exchange``'s events (events are not signed)."""
    return cl.Broker(exchange, transport="memory", signing=sg.Signing())


def test_publishers_of_one_destination_share_one_outbox(exchange: str) -> None:
    first = ev.EventPublisher(exchange, transport="memory")
    second = ev.EventPublisher(exchange, transport="memory")
    first.emit("task-sent")
    second.emit("task-sent")
    assert first.flush(WAIT) and second.flush(WAIT)
    assert first.published == second.published == 2


def test_a_closing_client_publishes_its_events_and_the_next_one_takes_later_ones(
    exchange: str, listening: Listening,
) -> None:
    publisher = ev.EventPublisher(exchange, transport="memory")
    for n in range(3):
        publisher.emit("task-sent", n=n)
    old = cl.client_for(_destination(exchange))
    assert old.event_outbox().queued == 3
    old.close()  # what it holds goes out before its connections close
    assert old.event_outbox().published == 3
    with pytest.raises(cl.ClientClosed):
        old.event_outbox().put("task-sent", {"n": "lost"})
    publisher.emit("task-sent", n=3)  # through the broker's next client
    assert publisher.flush(WAIT)
    assert [e["n"] for e in listening.wait_for(4)] == [0, 1, 2, 3]
    assert cl.client_for(_destination(exchange)) is not old


# -- composing sinks ----------------------------------------------------------------------------


class Recorder(ext.EventSink):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def emit(self, event_type: str, **fields: object) -> None:
        self.events.append((event_type, fields))


class Raising(ext.EventSink):
    def emit(self, event_type: str, **fields: object) -> None:
        raise RuntimeError("broken sink")


def test_fanout_sink_isolates_a_failing_sink() -> None:
    first, last = Recorder(), Recorder()
    sink = ev.FanoutSink(first, Raising(), last)
    sink.emit("task-sent", n=1)
    sink.close()
    assert first.events == last.events == [("task-sent", {"n": 1})]


def test_combine() -> None:
    one = Recorder()
    assert ev.combine() is ext.NO_EVENTS
    assert ev.combine(ext.NO_EVENTS, one) is one
    both = ev.combine(one, Recorder())
    assert isinstance(both, ev.FanoutSink) and len(both.sinks) == 2


def test_ticker_emits_until_stopped() -> None:
    ticks = threading.Semaphore(0)

    class Counting(ext.EventSink):
        def emit(self, event_type: str, **fields: object) -> None:
            assert (event_type, fields) == ("worker-heartbeat", {"free": 3})
            ticks.release()

    ticker = ev.Ticker(Counting(), "worker-heartbeat", 0.01, lambda: {"free": 3})
    ticker.start()
    for _ in range(3):
        assert ticks.acquire(timeout=WAIT)
    ticker.stop()
    with pytest.raises(ValueError, match="worker-heartbeat interval"):
        ev.Ticker(Counting(), "worker-heartbeat", 0, dict)


def test_human_readable_event_line() -> None:
    from flowengine.cli.events import format_line

    event = {"type": "task-succeeded", "hostname": "w1", "pid": 42, "clock": 7,
             "timestamp": 1_700_000_000.25, "utcoffset": 0, "local_received": 1_700_000_001.0,
             "flow_uuid": "f-1", "task_name": "create volume", "attempt": 1, "runtime": 0.3679,
             "worker": "w1:42:ab", "extra": [1, 2], "topic": None}
    line = format_line(event)
    stamp = time.strftime("%H:%M:%S", time.localtime(1_700_000_000.25)) + ".250"
    assert line == (f'{stamp} task-succeeded     w1:42#7 flow_uuid=f-1 task_name="create volume"'
                    " attempt=1 worker=w1:42:ab extra=[1, 2] runtime=0.368s")
