"""``--autoscale MAX,MIN``: the sizing decisions (injected clock), the pool, the prefetch.

A real worker process whose pool a backlog grows: tests/integration/test_autoscale.py.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
from click.testing import CliRunner
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine.cli.main import cli
from flowengine.cli.worker import parse_autoscale
from flowengine.cli.workers import _capacity
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker import transport_memory
from flowengine.worker_based.broker.delivery import Delivery
from flowengine.worker_based.worker_side.autoscale import AutoscalePool, Autoscaler

WAIT = 10.0


def test_a_backlog_grows_the_pool_to_max_and_the_prefetch_follows() -> None:
    scaler = Autoscaler(3, 1, clock=ManualClock())
    scaler.size = 1  # the MIN threads, started with the pool
    assert scaler.prefetch == 2  # one more than the pool: a backlog shows up
    assert not scaler.submitted()  # the idle thread takes it
    scaler.started()
    assert [scaler.submitted() for _ in range(4)] == [True, True, False, False]
    assert (scaler.size, scaler.queued, scaler.prefetch) == (3, 4, 3)  # at MAX: the pool


def test_idle_threads_retire_after_keepalive_down_to_min() -> None:
    clock = ManualClock()
    scaler = Autoscaler(3, 1, keepalive=10.0, clock=clock)
    scaler.size = 1
    for _ in range(3):
        scaler.submitted()
        scaler.started()
    idle_since = [scaler.finished() for _ in range(3)]
    clock.advance(9.9)
    assert not any(scaler.retire(since) for since in idle_since)
    clock.advance(0.1)
    assert [scaler.retire(since) for since in idle_since] == [True, True, False]
    assert (scaler.size, scaler.prefetch) == (1, 2)
    scaler.submitted()  # something waits: nobody retires
    clock.advance(100)
    assert not scaler.retire(idle_since[2])


def test_bad_autoscale_values_are_refused() -> None:
    with pytest.raises(ValueError, match="MAX=2 MIN=3"):
        Autoscaler(2, 3)
    assert parse_autoscale("8,2") == (8, 2) and parse_autoscale("4") == (4, 0)
    result = CliRunner().invoke(cli, ["worker", "--topic", "t", "--task", "m",
                                      "--autoscale", "2,x"])
    assert result.exit_code == 2 and "'2,x' is not MAX,MIN" in result.output
    result = CliRunner().invoke(cli, ["worker", "--topic", "t", "--task", "m",
                                      "--autoscale", "2,1", "--threads", "3"])
    assert result.exit_code == 2 and "exclude each other" in result.output


def test_the_pool_runs_everything_and_grows_with_blocked_work() -> None:
    pool = AutoscalePool(Autoscaler(3, 1, keepalive=0.05))
    release, running = threading.Event(), threading.Semaphore(0)

    def blocked(n: int) -> int:
        running.release()
        assert release.wait(WAIT)
        return n

    try:
        futures = [pool.submit(blocked, n) for n in range(5)]
        for _ in range(3):  # three at once: the pool grew from 1 to MAX
            assert running.acquire(timeout=WAIT)
        assert pool.size == 3 and not running.acquire(timeout=0.05)
        release.set()
        assert [f.result(WAIT) for f in futures] == [0, 1, 2, 3, 4]
        failing = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(WAIT)
    finally:
        pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(int)


#: Set by a test: the next drain of a :class:`_DroppingTransport` consumer loses its connection.
_LOSE_NEXT_DRAIN = threading.Event()


class _DroppingTransport(transport_memory.Transport):
    """The memory transport, whose consumer finds its connection lost at the next drain once
    :data:`_LOSE_NEXT_DRAIN` is set, as when a broker drops it: the one simulated edge."""

    def drain_events(self, connection: Any, timeout: float | None = None,
                     **kwargs: Any) -> None:
        if _LOSE_NEXT_DRAIN.is_set():
            _LOSE_NEXT_DRAIN.clear()
            raise self.connection_errors[0]("connection dropped by the test")
        super().drain_events(connection, timeout=timeout, **kwargs)


def test_after_a_reconnect_prefetch_leaves_room_for_requests_still_running(
        exchange: str) -> None:
    _LOSE_NEXT_DRAIN.clear()
    connected, taken = threading.Semaphore(0), queue.Queue[Delivery]()
    proxy = px.Proxy(
        "t", exchange, {pr.NOTIFY: dp.Handler(lambda _data, delivery: taken.put(delivery),
                                              manual_ack=True)},
        transport=_DroppingTransport, prefetch=lambda: 4, on_connected=connected.release,
        retry_options={"interval_start": 0.0})
    consumer = threading.Thread(target=proxy.start, daemon=True)
    consumer.start()
    try:
        assert connected.acquire(timeout=WAIT)
        for _ in range(3):
            proxy.publish(pr.Notify(), "t")
        # Three requests taken (and still running) on the connection about to be lost.
        held = [taken.get(timeout=WAIT) for _ in range(3)]
        _LOSE_NEXT_DRAIN.set()
        assert connected.acquire(timeout=WAIT), "the consumer never reconnected"
        assert proxy.prefetch_limit == 1  # 4 slots, 3 still busy
        held[0].ack()  # settled at once, from this thread: the memory transport is virtual
        assert proxy.prefetch_limit == 2  # back up as they settle...
        held[1].ack()
        held[2].ack()
        assert proxy.prefetch_limit == 4  # ...to the pool's own
    finally:
        proxy.stop()
        consumer.join(WAIT)
        proxy.close()


def test_workers_capacity_column_shows_the_pool_size() -> None:
    assert _capacity({"capacity": 8, "threads": 2}) == "2/8"
    assert _capacity({"capacity": 8, "threads": 8}) == "8"
    assert _capacity({"capacity": None, "threads": None}) == "-"
