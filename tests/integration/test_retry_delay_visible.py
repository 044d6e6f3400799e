"""A retry's wait as a delayed dispatch with a real worker process: visible, suspendable.

A worker-based engine runs a retried task on a ``flowengine worker`` process; the task fails
its first attempt and the controller decides the second at once: its request is sent with the
rest of the wait as a delay (doc/priorities.rst). On beanstalkd the server holds it (a delayed
job: ``flowengine topics`` counts it under DELAYED); on Redis and RabbitMQ the engine process's
broker client holds it and publishes it when due. During the wait an operator sees it in the
event stream (``task-delayed`` with its due time, as ``flowengine events`` reads it) and in
``flowengine show`` (``DELAYED UNTIL`` on the controller and on the task). The engine is
suspended during the wait: the delayed request is taken back (deleted from beanstalkd, dropped
by the client); a second engine resumes the stored flow and sends it again with only what is
left of the wait, and the flow finishes on the worker. Nothing sleeps a wait: the retry clock
and the clock of client-held requests are injected (engine option ``retry_clock``,
``held_publishes.CLOCK``), and a beanstalkd job's delay is ended with ``kick-job``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fault_tasks as ft
import greenstalk
import pytest
from click.testing import CliRunner
from fault_support import WAIT, EngineRuns, Stage, wait_until
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from wbe_harness import require_broker

from flowengine import engines, retry, states
from flowengine.cli import formatting as fmt
from flowengine.cli.main import cli
from flowengine.engines.actions import META_ATTEMPT_IDS, META_DELAYED_JOB
from flowengine.flows import linear_flow as lf
from flowengine.persistence import backends
from flowengine.utils import persistence_utils
from flowengine.worker_based import client as bc
from flowengine.worker_based.broker import transport_beanstalk_delays as beanstalk_delays
from flowengine.worker_based.engine_side import held_publishes
from flowengine.worker_based.events import EventReceiver
from flowengine.worker_based.topics import topic_stats

pytestmark = pytest.mark.integration

TOPIC = "delays"
#: The controller's wait before attempt 2 (on the injected clock, or ended by a kick).
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


def _meta(engine: Any, name: str) -> dict[str, Any]:
    storage = engine.storage
    return dict(storage.flow_detail.find(storage.get_atom_uuid(name)).meta)


def _held(request_id: str) -> bool:
    """Whether this process's broker client holds ``request_id`` (client-held delays)."""
    return any(request_id in client.held for client in bc.clients())


def kick(job: str) -> None:
    """End a delayed beanstalkd job's delay now (``kick-job``), as its time passing would."""
    address, job_id = beanstalk_delays.parse(job)
    with greenstalk.Client(address) as client:
        client.kick_job(job_id)


@pytest.mark.parametrize("broker_name", ["beanstalk", "redis", "rabbitmq"])
def test_a_retry_wait_is_a_visible_delayed_dispatch_that_survives_suspension(
    broker_name: str, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
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
    monkeypatch.setattr(held_publishes, "CLOCK", clock)

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


def _delayed_request(broker_name: str, url: str, exchange: str, engine: Any) -> str:
    """Check the request of attempt 2 waits out its delay where it should; return its id."""
    request_id = _meta(engine, "flaky")[META_ATTEMPT_IDS][-1]
    if broker_name == "beanstalk":
        # At the broker, as a delayed job whose handle is stored with the task: what
        # ``flowengine topics`` shows an operator.
        result = CliRunner().invoke(cli, ["topics", "--json", "--url", url, "--exchange",
                                          exchange, TOPIC], catch_exceptions=False)
        (row,) = [json.loads(line) for line in result.stdout.splitlines()]
        assert (row["ready"], row["delayed"], row["running"]) == (0, 1, 0), row
        assert _meta(engine, "flaky")[META_DELAYED_JOB].startswith("beanstalk://")
    else:
        # The attempt's id is stored before its request is sent: the engine's thread may not
        # have handed it to the client yet.
        wait_until(lambda: _held(request_id), WAIT, "attempt 2 held by the broker client")
        stats = {s.topic: s for s in topic_stats(exchange, [TOPIC], url=url)}[TOPIC]
        assert stats.ready == 0, stats  # held by the engine's process, not queued
    return request_id


def _wait_suspend_and_resume(broker_name: str, url: str, exchange: str, backend_uri: str,
                             flow_uuid: str, clock: ManualClock, stage: Stage, events: Events,
                             engine_run: Callable[[], tuple[Any, Any]]) -> None:
    engine, run = engine_run()
    delayed = events.of("task-delayed", 1)[0]
    assert (delayed["task_name"], delayed["attempt"], delayed["delay"]) == ("r", 2, DELAY)
    due = delayed["due"]
    assert due == pytest.approx(clock.now + DELAY)
    # The controller decided attempt 2 at once; its request is sent with the wait as a delay.
    wait_until(lambda: _meta(engine, "flaky").get("delayed_until") == due, WAIT,
               "attempt 2 sent as a delayed dispatch")
    if broker_name == "beanstalk":
        wait_until(lambda: _meta(engine, "flaky").get(META_DELAYED_JOB), WAIT,
                   "the delayed job's handle stored")
    first = _delayed_request(broker_name, url, exchange, engine)
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1]

    # What an operator sees during the wait.
    shown = _show(backend_uri, flow_uuid)
    assert (shown["r"]["state"], shown["r"]["delayed_until"]) == (
        states.SUCCESS, fmt.timestamp(due))
    assert (shown["flaky"]["state"], shown["flaky"]["delayed_until"]) == (
        states.RUNNING, fmt.timestamp(due))

    # Suspended during the wait: the delayed request is taken back, and the run ends at once.
    clock.advance(DELAY / 3)
    engine.suspend()
    assert run.join(WAIT) is None
    assert engine.storage.get_flow_state() == states.SUSPENDED
    stats = {s.topic: s for s in topic_stats(exchange, [TOPIC], url=url)}[TOPIC]
    assert stats.ready == 0 and stats.delayed in (0, None), stats  # None: not counted there
    assert not _held(first)
    assert _show(backend_uri, flow_uuid)["flaky"]["delayed_until"] == fmt.timestamp(due)

    # Another engine resumes the stored flow and sends attempt 2 with what is left of the wait.
    resumed, run = engine_run()
    again = events.of("task-delayed", 2)[1]
    assert (again["due"], again["delay"]) == (due, pytest.approx(DELAY * 2 / 3))
    wait_until(lambda: _meta(resumed, "flaky")[META_ATTEMPT_IDS][-1] != first, WAIT,
               "attempt 2 sent again")
    if broker_name == "beanstalk":
        wait_until(lambda: _meta(resumed, "flaky").get(META_DELAYED_JOB), WAIT,
                   "the delayed job's handle stored")
    _delayed_request(broker_name, url, exchange, resumed)
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1]
    if broker_name == "beanstalk":
        kick(_meta(resumed, "flaky")[META_DELAYED_JOB])
    else:
        clock.advance(DELAY * 2 / 3)  # the client's housekeeping publishes it
    assert run.join(WAIT) is None
    assert resumed.storage.get_flow_state() == states.SUCCESS
    assert resumed.storage.get("flaky")["attempt"] == 2
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1, 2]
    assert [e["attempt"] for e in events.of("task-delay-ended", 1)] == [2]
    shown = _show(backend_uri, flow_uuid)
    assert (shown["r"]["delayed_until"], shown["flaky"]["delayed_until"]) == (None, None)
