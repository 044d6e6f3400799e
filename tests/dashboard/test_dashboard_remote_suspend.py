"""Suspending a flow that another process runs: from the dashboard in Chromium, and from the CLI.

Real processes throughout: ``flowengine run`` runs the flow (the worker-based engine on Redis,
with two ``flowengine worker`` processes; or the serial engine), the dashboard is served by
uvicorn in this process, and ``flowengine suspend`` is run as a command. The request travels
through the SQLite store the engine writes (see flowengine.engines.suspend_requests).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dashboard_flows as df
import pytest
from dashboard_site import HERE, REPO, Site, chromium, click, close_chromium, screenshot, wait_for
from dashboard_store import FACTORIES, open_store
from test_dashboard_browser import css, texts

from flowengine import states
from flowengine.dashboard import DashboardData, EventHub, create_app
from flowengine.engines import suspend_requests as sr
from flowengine.persistence import base, models
from flowengine.persistence.queries import FlowQuery, find_flows
from flowengine.worker_based.events import EventReceiver

# Slowest test here: 16 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "remote-suspend"
#: Seconds a process of these tests may take to end once asked.
ENDS = 60.0


@dataclasses.dataclass
class World:
    site: Site
    driver: Any
    data: DashboardData
    store: base.Backend
    store_url: str
    broker: dict[str, Any]
    gate: Path
    tmp: Path


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(REPO),
                                                      env.get("PYTHONPATH")]))
    return env


def _flowengine(*args: str, log: Path | None = None, **env: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "flowengine.cli.main", *args]
    if log is None:
        return subprocess.Popen(command, env=_env(**env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    with open(log, "w") as out:
        return subprocess.Popen(command, env=_env(**env), stdout=out,
                                stderr=subprocess.STDOUT, text=True)


def _broker_args(broker: dict[str, Any]) -> list[str]:
    return ["--url", broker["url"], "--exchange", broker["exchange"]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("remote-suspend")
    broker = {"exchange": f"dash-suspend-{uuid.uuid4().hex[:8]}", "url": redis_url}
    store = open_store(tmp / "flows.db")
    gate = tmp / "gate"
    workers = [_flowengine("worker", *_broker_args(broker), "--topic", TOPIC, "--threads", "2",
                           "--grace", "5", "--task", "dashboard_flows",
                           log=tmp / f"worker-{n}.log", **{df.GATE_ENV: str(gate)})
               for n in (1, 2)]
    driver = chromium()
    hub = EventHub(lambda: EventReceiver(**broker))
    data = DashboardData(store, hub, broker, factories=FACTORIES)
    try:
        with Site(create_app(data)) as site:
            wait_for(hub.listening.is_set, "the dashboard to follow the event stream")
            yield World(site, driver, data, store, f"sqlite:///{tmp / 'flows.db'}", broker,
                        gate, tmp)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(ENDS)
        close_chromium(driver)
        store.close()


def _start_run(world: World, *engine: str, **env: str) -> tuple[subprocess.Popen[str], str]:
    """``flowengine run`` of the gated flow in its own process; its flow's uuid once RUNNING."""
    if world.gate.exists():
        world.gate.unlink()
    known = {row.uuid for row in find_flows(world.store, FlowQuery(limit=500)).rows}
    run = _flowengine("run", "dashboard_flows:gated", "--backend", world.store_url, "--plain",
                      *engine, log=world.tmp / f"run-{uuid.uuid4().hex[:6]}.log", **env)

    def running() -> str | None:
        assert run.poll() is None, f"flowengine run ended early with {run.returncode}"
        for row in find_flows(world.store, FlowQuery(states=(states.RUNNING,), limit=500)).rows:
            if row.uuid not in known and sr.META_RUNNING_ON in _stored(world, row.uuid).meta:
                return row.uuid
        return None

    return run, wait_for(running, "the run to store its flow RUNNING, with where it runs")


def _stored(world: World, flow: str) -> models.FlowDetail:
    conn = world.store.get_connection()
    try:
        return conn.get_flow_details(flow)
    finally:
        conn.close()


def _atom_states(world: World, flow: str) -> dict[str, str]:
    return {ad.name: ad.state for ad in _stored(world, flow)}


def _worker_based(world: World) -> list[str]:
    return ["--engine", "worker-based", *_broker_args(world.broker), "--topic", TOPIC]


def test_the_page_suspends_a_flow_another_process_runs_then_resumes_it(world: World) -> None:
    run, flow = _start_run(world, *_worker_based(world))
    driver = world.driver
    try:
        driver.get(f"{world.site.url}/flows/{flow}")
        assert texts(driver, "#flow-state") == [states.RUNNING]
        assert f"pid {run.pid}" in texts(driver, "#running-on")[0]
        click(driver, "button#suspend", "the Suspend button")
        notice = wait_for(lambda: texts(driver, "#notice"), "the suspend notice")
        assert "suspend requested for flow 'gated'" in notice[0], notice
        assert "its engine was told through the broker" in notice[0], notice
        # Pushed: the engine suspends while its only running atom is still held by the gate,
        # before any atom transition could have shown it the stored request.
        wait_for(lambda: _stored(world, flow).state == states.SUSPENDING,
                 "the engine process to store SUSPENDING while its atom runs")
        driver.refresh()
        assert texts(driver, "#flow-state") == [states.SUSPENDING]
        assert not css(driver, "button#suspend")
        screenshot(driver, "flow-suspending")
        world.gate.touch()  # the running atom finishes; nothing after it starts
        wait_for(lambda: texts(driver, "#flow-state") == [states.SUSPENDED],
                 "the page to show the flow SUSPENDED (pushed by the engine's events)")
        assert run.wait(ENDS) == 5, "flowengine run exits 5 when its flow is suspended"
        atoms = _atom_states(world, flow)
        assert atoms["first"] == states.SUCCESS and atoms["last"] == states.PENDING, atoms
        assert sr.META_REQUEST not in _stored(world, flow).meta
        assert not texts(driver, "#suspend-requested")
        click(driver, "button#resume", "the Resume button")  # on the options it ran on
        wait_for(lambda: texts(driver, "#flow-state") == [states.SUCCESS],
                 "the resumed flow to show SUCCESS")
        assert world.data.wait_idle(ENDS)
        assert set(_atom_states(world, flow).values()) == {states.SUCCESS}
    finally:
        world.gate.touch()
        if run.poll() is None:
            run.kill()
            run.wait()


def _suspend(world: World, flow: str, *options: str) -> subprocess.Popen[str]:
    return _flowengine("suspend", flow, "--backend", world.store_url, *options)


@pytest.mark.parametrize("engine", ["worker-based", "worker-based-store-only", "serial"])
def test_the_command_suspends_a_flow_another_process_runs(world: World, engine: str) -> None:
    """``flowengine suspend``: pushed to a worker-based engine on its broker; through the store
    alone when the command names no broker, and for the serial engine."""
    if engine == "serial":  # the gated atoms run in the engine's own process
        run, flow = _start_run(world, **{df.GATE_ENV: str(world.gate)})
    else:
        run, flow = _start_run(world, *_worker_based(world))
    broker = _broker_args(world.broker) if engine == "worker-based" else []
    try:
        asking = _suspend(world, flow, "--wait", str(ENDS), *broker)
        assert asking.stdout is not None
        said = asking.stdout.readline()  # acknowledged before the engine stops
        assert "suspend requested for flow 'gated'" in said and f"pid {run.pid}" in said, said
        if engine == "worker-based":
            assert "its engine was told through the broker" in asking.stdout.readline()
            wait_for(lambda: _stored(world, flow).state == states.SUSPENDING,
                     "the engine to suspend while its atom runs")
        elif engine == "worker-based-store-only":
            assert "not on this broker: it sees the stored request" in asking.stdout.readline()
        assert _stored(world, flow).state in (states.RUNNING, states.SUSPENDING)
        world.gate.touch()
        out, err = asking.communicate(timeout=ENDS)
        assert asking.returncode == 5, (out, err)
        assert f"flow {flow} is SUSPENDED" in out
        assert run.wait(ENDS) == 5
        atoms = _atom_states(world, flow)
        assert atoms["first"] == states.SUCCESS and atoms["last"] == states.PENDING, atoms
        again = _suspend(world, flow)
        out, err = again.communicate(timeout=ENDS)
        assert again.returncode == 2 and "is SUSPENDED, not running anywhere" in err, (out, err)
    finally:
        world.gate.touch()
        if run.poll() is None:
            run.kill()
            run.wait()
