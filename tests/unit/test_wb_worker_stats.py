"""``Worker.stats()``: what a worker is doing, read at one moment, and the same figures in its
``worker-heartbeat`` events.

A real worker on kombu's memory transport runs a request that blocks until the test lets it go.
"""

from __future__ import annotations

import functools
import queue
import threading
import uuid
from collections.abc import Iterator

import pytest
from wb_requester import TOPIC, WAIT, Requester, run_in_thread

from flowengine import task
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import worker as wk

TRANSPORT = {"transport": "memory"}
GATE = threading.Event()
STARTED = threading.Event()


class Blocks(task.Task):
    def execute(self) -> str:
        STARTED.set()
        GATE.wait(WAIT)
        return "done"


class Heartbeats(ext.EventSink):
    """Keeps the worker's heartbeat events, for the test to wait on."""

    def __init__(self) -> None:
        self.beats: queue.Queue[dict[str, object]] = queue.Queue()

    def emit(self, event_type: str, **fields: object) -> None:
        if event_type == "worker-heartbeat":
            self.beats.put(fields)

    def next_where(self, **wanted: object) -> dict[str, object]:
        """The first heartbeat from now on whose fields include ``wanted``."""
        while True:
            beat = self.beats.get(timeout=WAIT)
            if all(beat.get(key) == value for key, value in wanted.items()):
                return beat


@pytest.fixture
def served() -> Iterator[tuple[wk.Worker, Heartbeats, Requester]]:
    GATE.clear()
    STARTED.clear()
    exchange = f"stats-{uuid.uuid4().hex[:8]}"
    beats = Heartbeats()
    worker = wk.Worker(exchange, TOPIC, [Blocks], threads_count=2, events=beats,
                       heartbeat_interval=0.05, **TRANSPORT)
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    requester = Requester(exchange, TRANSPORT)
    try:
        yield worker, beats, requester
    finally:
        GATE.set()
        requester.close()
        worker.stop(grace=WAIT)
        thread.join(WAIT)


def test_stats_tell_what_the_worker_is_doing_now(
        served: tuple[wk.Worker, Heartbeats, Requester]) -> None:
    worker, beats, requester = served
    idle = worker.stats()
    assert (idle.topic, idle.capacity, idle.threads, idle.free_slots, idle.in_flight) == (
        TOPIC, 2, 2, 2, 0)
    assert idle.worker_id == worker.worker_id and not idle.paused and idle.revoked == 0
    request = requester.send(Blocks("one"))
    assert STARTED.wait(WAIT)
    busy = worker.stats()
    assert (busy.free_slots, busy.in_flight) == (1, 1)
    beat = beats.next_where(in_flight=1)
    assert (beat["worker"], beat["free"], beat["capacity"], beat["prefetch"]) == (
        busy.worker_id, busy.free_slots, busy.capacity, busy.prefetch)
    worker.pause(60)
    paused = worker.stats()
    assert paused.paused and paused.paused_for is not None and 0 < paused.paused_for <= 60
    worker.resume()
    GATE.set()
    assert requester.outcome(request)[-1]["state"] == pr.SUCCESS
    beats.next_where(in_flight=0, free=2)
    done = worker.stats()
    assert (done.free_slots, done.in_flight, done.paused) == (2, 0, False)


def test_a_revoke_for_a_request_not_seen_yet_is_counted(
        served: tuple[wk.Worker, Heartbeats, Requester]) -> None:
    worker, _beats, requester = served
    ids = [uuid.uuid4().hex, uuid.uuid4().hex]
    requester.proxy.publish(cn.Cancel(ids), ext.DISCOVER_ROUTING_KEY,
                            headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                            declare_queue=False)
    waited = threading.Event()
    for _ in range(int(WAIT * 100)):  # the CANCEL is handled on the worker's control thread
        if worker.stats().revoked == 2:
            break
        waited.wait(0.01)
    assert worker.stats().revoked == 2
