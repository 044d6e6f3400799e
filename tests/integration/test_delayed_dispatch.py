"""Delayed dispatch on every transport: memory, flowengine-fs, Redis, RabbitMQ and beanstalkd.

A :class:`~flowengine.worker_based.executor.WorkerTaskExecutor` sends a request with a delay to
a real worker (on a thread of this process, over the transport under test). While the delay
lasts no worker may take it: on beanstalkd it waits at the server as a delayed job
(``flowengine topics`` counts it under DELAYED), elsewhere the process's broker client holds it
and nothing is queued. When it is due it runs; taken back during its delay (an engine
suspending) it never reaches a worker. Nothing sleeps a delay: client-held requests follow an
injected clock (``held_publishes.CLOCK``), and a beanstalkd job's delay is ended with
``kick-job``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import event_tasks
import greenstalk
import pytest
from fault_support import WAIT, wait_until
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from wbe_harness import TRANSPORTS

from flowengine.engines.executor import EXECUTED
from flowengine.exceptions import RequestTimeout
from flowengine.worker_based.broker import transport_beanstalk_delays as beanstalk_delays
from flowengine.worker_based.engine_side import held_publishes
from flowengine.worker_based.executor import WorkerTaskExecutor
from flowengine.worker_based.topics import topic_stats
from flowengine.worker_based.worker import Worker

pytestmark = pytest.mark.integration

TOPIC = "delayed"
#: The delay requests are sent with (never waited out: moved by a clock or a kick).
DELAY = 600.0


class Setup:
    """A worker serving :mod:`event_tasks` and an executor sending to it, on one transport."""

    def __init__(self, name: str, where: dict[str, Any], clock: ManualClock) -> None:
        self.name, self.where, self.clock = name, where, clock
        self.exchange = f"delayed-{uuid.uuid4().hex[:10]}"
        self.worker = Worker(self.exchange, TOPIC, [event_tasks], threads_count=2, **where)
        self._thread = threading.Thread(target=self.worker.run,
                                        kwargs={"display_banner": False}, daemon=True)
        self._thread.start()
        assert self.worker.wait(WAIT)
        # topics=[]: the worker is found by broadcast, so its topic's queue holds requests
        # only (a NOTIFY sent to the topic would be counted as ready until it is taken).
        self.executor = WorkerTaskExecutor(uuid.uuid4().hex, self.exchange, [],
                                           transition_timeout=WAIT, **where)
        self.executor.start()
        assert self.executor.wait_for_workers(timeout=WAIT) == 0

    @property
    def native(self) -> bool:
        return self.name == "beanstalk"

    def stats(self) -> Any:
        (stats,) = topic_stats(self.exchange, [TOPIC], **self.where)
        return stats

    def close(self) -> None:
        self.executor.stop()
        self.worker.stop(grace=5.0)
        self._thread.join(WAIT)


@pytest.fixture(params=sorted(TRANSPORTS))
def setup(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    clock = ManualClock()
    monkeypatch.setattr(held_publishes, "CLOCK", clock)
    made = Setup(request.param, TRANSPORTS[request.param](tmp_path), clock)
    try:
        yield made
    finally:
        made.close()


def _send(setup: Setup, x: int) -> tuple[Any, str, str | None]:
    """Send ``Add(x)`` with :data:`DELAY`; return its future, request id and job handle."""
    atom_uuid = uuid.uuid4().hex
    request_id = setup.executor.reserve_request_id(atom_uuid)
    assert request_id is not None
    jobs: list[str] = []
    future = setup.executor.execute_task(event_tasks.Add("add"), atom_uuid, {"x": x},
                                         delay=DELAY, on_delayed_job=jobs.append)
    # The worker is known: the request is put (or held) before execute_task returns.
    assert len(jobs) == setup.native, jobs
    return future, request_id, jobs[0] if jobs else None


def _waits(setup: Setup, request_id: str) -> None:
    """The request waits out its delay where its transport keeps delays, and nowhere else."""
    stats = setup.stats()
    assert stats.ready == 0, stats
    if setup.native:
        assert stats.delayed == 1, stats
    else:
        assert request_id in setup.executor.client.held


def test_a_delayed_request_runs_when_due(setup: Setup) -> None:
    future, request_id, job = _send(setup, 41)
    _waits(setup, request_id)
    assert not future.done()
    if job is not None:
        address, job_id = beanstalk_delays.parse(job)
        with greenstalk.Client(address) as client:
            client.kick_job(job_id)  # its delay ends now
    else:
        setup.clock.advance(DELAY)  # the client's housekeeping publishes it
    assert future.result(WAIT) == (EXECUTED, 42)


def test_a_delayed_request_taken_back_never_reaches_a_worker(setup: Setup) -> None:
    future, request_id, _job = _send(setup, 1)
    assert not future.cancel()  # published: taken back, then cancelled
    wait_until(future.cancelled, WAIT, "the delayed request taken back")
    stats = setup.stats()
    assert stats.ready == 0 and stats.delayed in (0, None), stats
    assert request_id not in setup.executor.client.held
    setup.clock.advance(DELAY)
    # A request sent after it runs, and nothing of the taken-back one reached the worker.
    assert setup.executor.execute_task(event_tasks.Add("add"), uuid.uuid4().hex,
                                       {"x": 2}).result(WAIT) == (EXECUTED, 3)
    assert setup.stats().delayed in (0, None)


def test_a_delayed_requests_timeout_counts_from_when_it_is_due() -> None:
    clock = ManualClock()
    executor = WorkerTaskExecutor(uuid.uuid4().hex, f"delayed-{uuid.uuid4().hex[:10]}", [TOPIC],
                                  transition_timeout=5.0, transport="memory", clock=clock)
    executor.start()
    try:
        future = executor.execute_task(event_tasks.Add("add"), uuid.uuid4().hex, {"x": 1},
                                       delay=DELAY)
        clock.advance(DELAY - 1.0)  # far past transition_timeout, still inside the delay
        executor.on_wait()
        assert not future.done()
        clock.advance(7.0)  # past transition_timeout after it was due
        executor.on_wait()
        outcome = future.result(WAIT)[1]
        assert outcome.check(RequestTimeout), outcome
    finally:
        executor.stop()


def test_a_stored_job_id_another_job_has_taken_is_not_deleted(beanstalk_url: str) -> None:
    # A beanstalkd restarted without a binlog numbers jobs from 1 again: the id an engine stored
    # may name another program's job when the flow is resumed. Only the attempt's job goes.
    address = beanstalk_delays.parse(beanstalk_url + "/1")[0]
    tube = f"reused-{uuid.uuid4().hex[:10]}"
    with greenstalk.Client(address, use=tube, watch=tube) as client:
        other = client.put(b'{"someone": "else"}', delay=DELAY)
        mine = client.put(b'{"correlation_id": "attempt-7"}', delay=DELAY)
        try:
            assert not beanstalk_delays.delete(beanstalk_delays.handle(address, other,
                                                                       "attempt-7"))
            assert client.peek(other).id == other  # still there
            assert beanstalk_delays.delete(beanstalk_delays.handle(address, mine, "attempt-7"))
            with pytest.raises(greenstalk.NotFoundError):
                client.peek(mine)
        finally:
            for job_id in (other, mine):
                try:
                    client.delete(job_id)
                except greenstalk.NotFoundError:
                    pass
