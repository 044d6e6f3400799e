"""Cancelling a flow whose tasks run on worker processes, on every real broker.

A five-task linear flow runs on ``flowengine worker`` processes; its third task loops until its
context says the flow is being cancelled. ``flowengine cancel`` (a process of its own), an
expired deadline, or an async third task interrupted at an await: each time task 3 returns
within two heartbeat intervals of the engine applying the cancel, tasks 2 and 1 are reverted in
that order, tasks 4 and 5 never run, and ``flowengine show`` says REVERTED with the reason. The
tasks' own ledger says what ran, never the engine's records.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import stopping_flows as sf
from fault_support import WAIT, EngineRuns, flowengine_cli, logs, wait_until
from wbe_harness import Broker

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.persistence import backends, models

pytestmark = pytest.mark.integration

TOPIC = "stopping"
#: Seconds between the workers' heartbeats: the stop must reach task 3 within two of them.
HEARTBEAT = 1.0


class Story:
    """One cancel story: the workers, the store, the engine, and when its cancel applied."""

    def __init__(self, broker: Broker, exchange: str, fleet_factory: Any, tmp_path: Path,
                 middle: str = "loops", **options: Any) -> None:
        self.ledger = tmp_path / "ledger.jsonl"
        self.fleet = fleet_factory(broker, exchange, env={sf.LEDGER_ENV: str(self.ledger)})
        self.workers = self.fleet.start(TOPIC, [sf.__name__], threads=2)
        self.uri = f"sqlite:///{tmp_path / 'flows.db'}"
        self.backend = backends.backend(self.uri).__enter__()
        self.engine = engines.load(
            sf.five(middle), backend=self.backend, book=models.LogBook("stopping"),
            engine="worker-based", **self.fleet.engine_options(
                TOPIC, heartbeat_interval=HEARTBEAT, lease_timeout=5 * HEARTBEAT,
                transition_timeout=WAIT), **options)
        #: When (epoch seconds) the engine applied each cancel.
        self.applied: list[float] = []
        self.engine.interventions.register(
            "cancelled", lambda _kind, details: self.applied.append(time.time()))

    @property
    def flow(self) -> str:
        return str(self.engine.storage.flow_uuid)

    def events(self, atom: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        return [line for line in sf.read(self.ledger)
                if (atom is None or line["atom"] == atom)
                and (event is None or line["event"] == event)]

    def wait_running(self) -> None:
        wait_until(lambda: self.events("s3", "execute"), WAIT, "task 3 running",
                   details=lambda: logs(self.workers))

    def check(self, reason: str) -> None:
        """Task 3 stopped within two heartbeat intervals, 3-2-1 reverted, 4 and 5 never ran,
        and ``flowengine show`` tells the reason."""
        [stopped] = self.events("s3", "stopped")
        assert stopped["reason"] == reason
        assert self.applied, "the engine never applied the cancel"
        took = stopped["t"] - self.applied[0]
        assert took < 2 * HEARTBEAT, f"task 3 stopped {took:.3f}s after the cancel applied"
        assert [e["atom"] for e in self.events(event="revert")] == ["s3", "s2", "s1"]
        assert [e["atom"] for e in self.events(event="execute")] == ["s1", "s2", "s3"]
        shown = flowengine_cli("show", self.flow, "--backend", self.uri)
        assert shown.returncode == 0, shown.stderr
        out = shown.stdout.splitlines()
        assert out[0] == f"flow five ({self.flow}): REVERTED", out
        assert any(line.startswith("  cancelled by ") and line.endswith(f": {reason}")
                   for line in out), out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.backend.close()


@pytest.fixture
def story(broker: Broker, exchange: str, fleet_factory: Any, tmp_path: Path,
          request: pytest.FixtureRequest) -> Any:
    made: list[Story] = []

    def make(**options: Any) -> Story:
        made.append(Story(broker, exchange, fleet_factory, tmp_path, **options))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_flowengine_cancel_stops_task_3_and_reverts_2_then_1(story: Any,
                                                             runs: EngineRuns) -> None:
    told = story()
    run = runs.start(told.engine)
    told.wait_running()
    done = flowengine_cli("cancel", told.flow, "--reason", "the customer withdrew",
                          "--backend", told.uri, "--url", told.fleet.url,
                          "--exchange", told.fleet.exchange, "--wait", str(WAIT))
    assert done.returncode == 7, done.stdout + done.stderr
    assert "cancel requested for flow 'five'" in done.stdout
    assert "its engine was told through the broker, and is cancelling" in done.stdout
    assert isinstance(run.join(WAIT, details=lambda: logs(told.workers)), exc.FlowCancelled)
    told.check("the customer withdrew")
    # Its context, in the worker process, named the worker running it.
    [started] = told.events("s3", "execute")
    assert started["worker"].split(":")[1] == str(started["pid"])


def test_a_deadline_cancels_the_flow_with_no_command(story: Any, runs: EngineRuns) -> None:
    # Real seconds: tasks 1 and 2 take milliseconds, and task 3 waits for the cancel.
    told = story(deadline=3.0)
    run = runs.start(told.engine)
    error = run.join(WAIT, details=lambda: logs(told.workers))
    assert isinstance(error, exc.FlowCancelled) and error.reason == "deadline", error
    told.check("deadline")


def test_an_async_task_is_interrupted_at_its_next_await(story: Any, runs: EngineRuns) -> None:
    told = story(middle="async")
    run = runs.start(told.engine)
    told.wait_running()
    told.engine.cancel("stop awaiting", by="a test")
    assert isinstance(run.join(WAIT, details=lambda: logs(told.workers)), exc.FlowCancelled)
    told.check("stop awaiting")
    failure = told.engine.storage.flow_detail.find(
        told.engine.storage.get_atom_uuid("s3")).failure
    assert failure is not None and "interrupted at an await" in failure.exception_str
