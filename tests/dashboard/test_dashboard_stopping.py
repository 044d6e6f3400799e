"""Cancelling and repairing a flow from the dashboard's flow page, in Chromium.

Real processes: ``flowengine run`` runs the flow (on two ``flowengine worker`` processes over
Redis, or on the serial engine), the dashboard is served by uvicorn in this process. The
tasks' own ledger (:mod:`stopping_flows`) says what ran and what was undone.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stopping_flows as sf
from dashboard_site import Site, chromium, close_chromium, screenshot, wait_for
from dashboard_store import open_store
from test_dashboard_browser import css, texts
from test_dashboard_remote_suspend import _broker_args, _flowengine

from flowengine import states
from flowengine.dashboard import DashboardData, EventHub, create_app
from flowengine.engines.factory_policy import FactoryPolicy
from flowengine.persistence import base
from flowengine.persistence.queries import FlowQuery, find_flows
from flowengine.worker_based.events import EventReceiver

pytestmark = pytest.mark.integration

TOPIC = "dash-stopping"
#: Seconds a process of these tests may take to end once asked.
ENDS = 60.0
TESTS = str(Path(sf.__file__).resolve().parent)


@dataclasses.dataclass
class World:
    site: Site
    driver: Any
    data: DashboardData
    store: base.Backend
    store_url: str
    broker: dict[str, Any]
    ledger: Path
    tmp: Path

    @property
    def env(self) -> dict[str, str]:
        """What the processes running the flows need: the ledger, and ``tests/`` to import."""
        return {sf.LEDGER_ENV: str(self.ledger), "PYTHONPATH": TESTS}

    def events(self, event: str) -> list[str]:
        return [line["atom"] for line in sf.read(self.ledger) if line["event"] == event]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, redis_url: str,
          monkeypatch_module: Any) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("dash-stopping")
    ledger = tmp / "ledger.jsonl"
    monkeypatch_module.setenv(sf.LEDGER_ENV, str(ledger))  # the dashboard runs repairs here
    broker = {"exchange": f"dash-stop-{uuid.uuid4().hex[:8]}", "url": redis_url}
    store = open_store(tmp / "flows.db")
    env = {sf.LEDGER_ENV: str(ledger), "PYTHONPATH": TESTS}
    workers = [_flowengine("worker", *_broker_args(broker), "--topic", TOPIC, "--threads", "2",
                           "--grace", "5", "--task", sf.__name__, log=tmp / f"worker-{n}.log",
                           **env)
               for n in (1, 2)]
    driver = chromium()
    hub = EventHub(lambda: EventReceiver(**broker))
    # It runs the flows' reverts itself (repair): it must be allowed their factories' module.
    data = DashboardData(store, hub, broker, factories=FactoryPolicy((sf.__name__,)))
    try:
        with Site(create_app(data)) as site:
            wait_for(hub.listening.is_set, "the dashboard to follow the event stream")
            yield World(site, driver, data, store, f"sqlite:///{tmp / 'flows.db'}", broker,
                        ledger, tmp)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(ENDS)
        close_chromium(driver)
        store.close()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _run(world: World, *args: str) -> tuple[Any, str]:
    """``flowengine run ARGS`` in its own process; its flow's uuid once stored."""
    known = {row.uuid for row in find_flows(world.store, FlowQuery(limit=500)).rows}
    run = _flowengine("run", *args, "--backend", world.store_url, "--plain",
                      log=world.tmp / f"run-{uuid.uuid4().hex[:6]}.log", **world.env)

    def stored() -> str | None:
        new = [row.uuid for row in find_flows(world.store, FlowQuery(limit=500)).rows
               if row.uuid not in known]
        return new[0] if new else None

    return run, wait_for(stored, "the run to store its flow")


def _submit(driver: Any, field: str, text: str, button: str) -> None:
    """Fill the text field ``#field`` and press ``#button`` at once: the live part of the page
    is replaced whenever an event comes, which would drop a value typed a moment before."""
    def submitted() -> bool:
        return bool(driver.execute_script(
            "const f = document.getElementById(arguments[0]);"
            "const b = document.getElementById(arguments[2]);"
            "if (!f || !b) { return false; } f.value = arguments[1]; b.click(); return true;",
            field, text, button))

    wait_for(submitted, f"the {button} button")


def test_the_cancel_button_stops_a_flow_another_process_runs_and_reverts_it(
        world: World) -> None:
    run, flow = _run(world, "stopping_flows:five", "--engine", "worker-based",
                     *_broker_args(world.broker), "--topic", TOPIC)
    driver = world.driver
    try:
        wait_for(lambda: "s3" in world.events("execute"), "task 3 running on a worker")
        driver.get(f"{world.site.url}/flows/{flow}")
        assert texts(driver, "#flow-state") == [states.RUNNING]
        _submit(driver, "cancel-reason", "the customer withdrew", "cancel")
        notice = wait_for(lambda: texts(driver, "#notice"), "the cancel notice")
        assert "cancel requested for flow 'five'" in notice[0], notice
        assert "its engine was told through the broker, and is cancelling" in notice[0]
        wait_for(lambda: texts(driver, "#flow-state") == [states.REVERTED],
                 "the page to show the flow REVERTED (pushed by the engine's events)")
        assert "the customer withdrew" in texts(driver, "#cancelled-why")[0]
        assert not css(driver, "button#cancel")
        screenshot(driver, "flow-cancelled")
        assert run.wait(ENDS) == 7, "flowengine run exits 7 when its flow is cancelled"
        assert world.events("stopped") == ["s3"]
        assert world.events("revert") == ["s3", "s2", "s1"]
        assert world.events("execute") == ["s1", "s2", "s3"]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_the_repair_button_runs_the_failed_revert_again(world: World) -> None:
    fault = world.tmp / "fault"
    fault.touch()
    before = len(sf.read(world.ledger))
    run, flow = _run(world, "stopping_flows:revert_fault", "--kwarg", f"fault={fault}")
    assert run.wait(ENDS) == 4, "flowengine run exits 4: a revert failed"
    driver = world.driver
    driver.get(f"{world.site.url}/flows/{flow}")
    assert texts(driver, "#flow-state") == [states.FAILURE]
    assert css(driver, "button#mark-reverted-B")
    fault.unlink()  # the cause is fixed
    _submit(driver, "retry-reverts-reason", "the disk is back", "retry-reverts")
    notice = wait_for(lambda: texts(driver, "#notice"), "the repair notice")
    assert "repairing flow 'revert-fault' (retry-reverts)" in notice[0], notice
    assert world.data.wait_idle(ENDS)
    driver.refresh()
    assert texts(driver, "#flow-state") == [states.REVERTED]
    [listed] = texts(driver, "#repairs li")
    assert "retry-reverts by dashboard: the disk is back (atoms: B)" in listed, listed
    assert not css(driver, "button#retry-reverts")
    assert css(driver, "button#retry-from-C")  # what a reverted flow may still be repaired by
    screenshot(driver, "flow-repaired")
    done = [(line["event"], line["atom"]) for line in sf.read(world.ledger)[before:]]
    assert done[-2:] == [("revert", "B"), ("revert", "A")], done
    assert sf.read(world.ledger)[-2]["result"] == "B-resource"
