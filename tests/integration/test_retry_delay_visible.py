"""A retry's wait with a real worker process on beanstalkd and Redis: visible, suspendable.

A worker-based engine runs a retried task on a ``flowengine worker`` process; the task fails
its first attempt and the controller waits before the second. During the wait an operator sees
it in the events (``task-delayed`` with its due time), in ``flowengine show`` (the controller
``RETRYING``, ``DELAYED UNTIL``) and in ``flowengine topics`` (nothing queued for the topic:
the engine holds the wait, no request sits at the broker). The engine is suspended during the
wait; a second engine resumes the stored flow, waits only what is left, and the flow finishes
on the worker. The retry clock is injected (engine option ``retry_clock``), so the test moves
time instead of sleeping.
"""

from __future__ import annotations

import json
import threading
import time
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
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.event_listener import EventListener
from flowengine.worker_based.topics import topic_stats

pytestmark = pytest.mark.integration

TOPIC = "delays"
#: The controller's wait before attempt 2 (on the injected clock: nothing sleeps it).
DELAY = 600.0


class Events(ext.EventSink):
    """The events of one engine run, and a signal when its retry starts waiting."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.delayed = threading.Event()

    def emit(self, event_type: str, **fields: object) -> None:
        self.events.append((event_type, dict(fields)))
        if event_type == "task-delayed":
            self.delayed.set()

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [fields for kind, fields in self.events if kind == event_type]


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

    def engine_run(sink: Events) -> tuple[Any, Any]:
        engine = engines.load(flow, engine="worker-based", backend=backend, flow_detail=detail,
                              **fleet.engine_options(TOPIC, transition_timeout=WAIT,
                                                     retry_clock=clock))
        listener = EventListener(engine, sink, task_events=False)
        listener.register()
        return engine, runs.start(engine)

    first = Events()
    engine, run = engine_run(first)
    assert first.delayed.wait(WAIT), first.events
    delayed = first.of("task-delayed")[0]
    assert (delayed["task_name"], delayed["attempt"], delayed["delay"]) == ("r", 2, DELAY)
    due = delayed["due"]
    assert due == pytest.approx(clock.now + DELAY)
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1]

    # What an operator sees during the wait.
    shown = _show(backend_uri, detail.uuid)
    assert (shown["r"]["state"], shown["r"]["delayed_until"]) == (
        states.RETRYING, fmt.timestamp(due))
    assert shown["flaky"]["state"] == states.PENDING
    stats = {s.topic: s for s in topic_stats(exchange, [TOPIC], url=broker.url)}[TOPIC]
    assert stats.ready == 0, stats  # the engine holds the wait: nothing queued meanwhile
    if broker_name == "beanstalk":
        assert (stats.delayed, stats.running) == (0, 0), stats

    # Suspended during the wait: ends at once, starts no attempt, keeps the due time.
    clock.advance(DELAY / 3)
    engine.suspend()
    assert run.join(WAIT) is None
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert _show(backend_uri, detail.uuid)["r"]["delayed_until"] == fmt.timestamp(due)
    assert not first.of("task-delay-ended")

    # Another engine resumes the stored flow and waits only what is left.
    second = Events()
    resumed, run = engine_run(second)
    assert second.delayed.wait(WAIT), second.events
    again = second.of("task-delayed")[0]
    assert (again["due"], again["delay"]) == (due, pytest.approx(DELAY * 2 / 3))
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1]
    clock.advance(DELAY * 2 / 3)
    resumed.retry_waits.timer.check()
    assert run.join(WAIT) is None
    assert resumed.storage.get_flow_state() == states.SUCCESS
    assert resumed.storage.get("flaky")["attempt"] == 2
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1, 2]
    assert [e["attempt"] for e in second.of("task-delay-ended")] == [2]
    assert _show(backend_uri, detail.uuid)["r"]["delayed_until"] is None
