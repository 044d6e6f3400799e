"""A retry's wait with a real worker process on beanstalkd and Redis: visible, suspendable.

A worker-based engine runs a retried task on a ``flowengine worker`` process; the task fails
its first attempt and the controller waits before the second. During the wait an operator sees
it in the event stream (``task-delayed`` with its due time, as ``flowengine events`` reads
it), in ``flowengine show`` (the controller ``RETRYING``, ``DELAYED UNTIL``) and in
``flowengine topics`` (nothing queued for the topic: the engine holds the wait, no request sits
at the broker). The engine is suspended during the
wait; a second engine resumes the stored flow, waits only what is left, and the flow finishes
on the worker. The retry clock is injected (engine option ``retry_clock``), so the test moves
time instead of sleeping.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fault_tasks as ft
import pytest
from click.testing import CliRunner
from fault_support import WAIT, EngineRuns, Stage
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from wbe_harness import require_broker

from flowengine import engines, retry, states
from flowengine.cli import formatting as fmt
from flowengine.cli.main import cli
from flowengine.flows import linear_flow as lf
from flowengine.persistence import backends
from flowengine.utils import persistence_utils
from flowengine.worker_based.events import EventReceiver
from flowengine.worker_based.topics import topic_stats

pytestmark = pytest.mark.integration

TOPIC = "delays"
#: The controller's wait before attempt 2 (on the injected clock: nothing sleeps it).
DELAY = 600.0


class Events:
    """The flow's retry-wait events as an operator follows them (``flowengine events``): read
    from the exchange's event stream on a thread until closed."""

    def __init__(self, exchange: str, url: str, flow_uuid: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._ready, self._stop = threading.Event(), threading.Event()
        receiver = EventReceiver(exchange, url=url, flow=flow_uuid,
                                 types=("task-delayed", "task-delay-ended"))
        self._thread = threading.Thread(target=self._read, args=(receiver,), daemon=True)
        self._thread.start()
        assert self._ready.wait(WAIT), "the event receiver never listened"

    def _read(self, receiver: EventReceiver) -> None:
        for event in receiver.iter(ready=self._ready.set, stop=self._stop):
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()

    def of(self, event_type: str, count: int = 0) -> list[dict[str, Any]]:
        """The events of ``event_type``, once there are ``count`` of them."""
        with self._changed:
            assert self._changed.wait_for(
                lambda: len(self._of(event_type)) >= count, WAIT), self.events
            return self._of(event_type)

    def _of(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == event_type]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)


def _show(backend_uri: str, flow_uuid: str) -> dict[str, Any]:
    """``flowengine show --json`` of the flow: atom name -> its record."""
    result = CliRunner().invoke(cli, ["show", flow_uuid, "--backend", backend_uri, "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return {atom["name"]: atom for atom in json.loads(result.stdout)["atoms"]}


@pytest.mark.parametrize("broker_name", ["beanstalk", "redis"])
def test_a_retry_wait_is_visible_survives_suspension_and_the_flow_finishes(
    broker_name: str, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    tmp_path: Path,
) -> None:  # fmt: skip
    broker = require_broker(broker_name)
    fleet = fleet_factory(broker, exchange, env=stage.env)
    fleet.start(TOPIC, [ft.__name__], threads=1)
    backend_uri = f"sqlite:///{tmp_path / 'flows.db'}"
    backend = backends.fetch({"connection": backend_uri})
    backend.get_connection().upgrade()
    _book, detail = persistence_utils.temporary_flow_detail(backend)
    flow = lf.Flow("delayed", retry=retry.Times(3, name="r", provides="attempt", delay=DELAY))
    flow.add(ft.FailsFirst("flaky"))
    clock = ManualClock(time.time())

    def engine_run() -> tuple[Any, Any]:
        engine = engines.load(flow, engine="worker-based", backend=backend, flow_detail=detail,
                              **fleet.engine_options(TOPIC, transition_timeout=WAIT,
                                                     retry_clock=clock))
        return engine, runs.start(engine)

    events = Events(exchange, broker.url, detail.uuid)
    try:
        _wait_suspend_and_resume(broker_name, broker.url, exchange, backend_uri, detail.uuid,
                                 clock, stage, events, engine_run)
    finally:
        events.close()


def _wait_suspend_and_resume(broker_name: str, url: str, exchange: str, backend_uri: str,
                             flow_uuid: str, clock: ManualClock, stage: Stage, events: Events,
                             engine_run: Callable[[], tuple[Any, Any]]) -> None:
    engine, run = engine_run()
    delayed = events.of("task-delayed", 1)[0]
    assert (delayed["task_name"], delayed["attempt"], delayed["delay"]) == ("r", 2, DELAY)
    due = delayed["due"]
    assert due == pytest.approx(clock.now + DELAY)
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1]

    # What an operator sees during the wait.
    shown = _show(backend_uri, flow_uuid)
    assert (shown["r"]["state"], shown["r"]["delayed_until"]) == (
        states.RETRYING, fmt.timestamp(due))
    assert shown["flaky"]["state"] == states.PENDING
    stats = {s.topic: s for s in topic_stats(exchange, [TOPIC], url=url)}[TOPIC]
    assert stats.ready == 0, stats  # the engine holds the wait: nothing queued meanwhile
    if broker_name == "beanstalk":
        assert (stats.delayed, stats.running) == (0, 0), stats

    # Suspended during the wait: ends at once, starts no attempt, keeps the due time.
    clock.advance(DELAY / 3)
    engine.suspend()
    assert run.join(WAIT) is None
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert _show(backend_uri, flow_uuid)["r"]["delayed_until"] == fmt.timestamp(due)

    # Another engine resumes the stored flow and waits only what is left.
    resumed, run = engine_run()
    again = events.of("task-delayed", 2)[1]
    assert (again["due"], again["delay"]) == (due, pytest.approx(DELAY * 2 / 3))
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1]
    clock.advance(DELAY * 2 / 3)
    resumed.retry_waits.timer.check()
    assert run.join(WAIT) is None
    assert resumed.storage.get_flow_state() == states.SUCCESS
    assert resumed.storage.get("flaky")["attempt"] == 2
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1, 2]
    assert [e["attempt"] for e in events.of("task-delay-ended", 1)] == [2]
    assert _show(backend_uri, flow_uuid)["r"]["delayed_until"] is None
