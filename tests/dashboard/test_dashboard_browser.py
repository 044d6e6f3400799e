"""The dashboard in a real headless Chromium, with a flow running on real worker processes.

Workers are ``flowengine worker`` processes on the ``flowengine-fs`` transport (no server);
the dashboard is served by uvicorn; the engine runs in this process. The tests write the
screenshots doc/dashboard.rst shows.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dashboard_flows as df
import pytest
from dashboard_site import (
    Site,
    chromium,
    click,
    close_chromium,
    screenshot,
    start_worker,
    stop_workers,
    wait_for,
)
from dashboard_store import PASSWORD, open_store, store_run
from jobs.boards import make_redis_board, wipe_redis

from flowengine import engines, states
from flowengine.dashboard import DashboardData, EventHub, create_app
from flowengine.persistence import base, models
from flowengine.types.entity import Entity
from flowengine.worker_based import dead_letters, protocol
from flowengine.worker_based.broker import proxy
from flowengine.worker_based.events import EventReceiver

pytestmark = pytest.mark.integration

TOPIC = "dashboard"
TOKEN = "browser-token-" + uuid.uuid4().hex


@dataclasses.dataclass
class World:
    site: Site
    driver: Any
    store: base.Backend
    broker: dict[str, Any]
    gate: Path
    workers: list[Any]
    stored: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    driver = chromium()
    tmp = tmp_path_factory.mktemp("dashboard-browser")
    (tmp / "queues").mkdir()
    broker = {"exchange": f"dash-{uuid.uuid4().hex[:8]}", "transport": "flowengine-fs",
              "transport_options": {"data_folder": str(tmp / "queues")}}
    store = open_store(tmp / "flows.db")
    stored = {"provisioning": store_run(store, df.provisioning),
              "exploding": store_run(store, df.exploding)}
    hub = EventHub(lambda: EventReceiver(**broker))
    workers: list[Any] = []
    try:
        with Site(create_app(DashboardData(store, hub, broker))) as site:
            wait_for(hub.listening.is_set, "the dashboard to follow the event stream")
            workers += [start_worker(f"worker-{n}", broker["exchange"], TOPIC, tmp / "queues",
                                     tmp, {df.GATE_ENV: str(tmp / "gate")}) for n in (1, 2)]
            yield World(site, driver, store, broker, tmp / "gate", workers, stored)
    finally:
        stop_workers(workers)
        close_chromium(driver)
        store.close()


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def texts(driver: Any, selector: str) -> list[str]:
    """The text of each element ``selector`` matches, read at once (the live part of a page is
    replaced as it refreshes, so element handles go stale)."""
    return list(driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent);",
        selector))


def atom_states(driver: Any) -> dict[str, str]:
    return dict(driver.execute_script(
        "return Object.fromEntries(Array.from(document.querySelectorAll('svg g.atom'),"
        " g => [g.dataset.atom, g.dataset.state]));"))


def test_workers_page_shows_both_workers(world: World) -> None:
    world.driver.get(f"{world.site.url}/workers")
    wait_for(lambda: len(texts(world.driver, "#workers tr.alive")) == 2,
             "both workers on the page")
    wait_for(lambda: all("ago" in row for row in texts(world.driver, "#workers tr.alive")),
             "a heartbeat of each worker (every 2 s)")
    assert all(TOPIC in row for row in texts(world.driver, "#workers tr.alive"))
    screenshot(world.driver, "workers")


def test_flow_page_opened_mid_run_follows_the_atoms_to_the_end(world: World) -> None:
    engine = engines.load_from_factory(
        df.gated, book=models.LogBook("browser"), backend=world.store, engine="worker-based",
        topics=[TOPIC], **world.broker)
    flow = str(engine.storage.flow_uuid)

    runner = threading.Thread(target=engine.run, daemon=True)
    runner.start()
    driver = world.driver
    try:
        data = DashboardData(world.store, EventHub(None))
        wait_for(lambda: (data.flow(flow) or None) and any(
            a["state"] == states.RUNNING for a in data.flow(flow).atoms),  # type: ignore[union-attr]
            "the flow's first atom to be stored RUNNING")
        driver.get(f"{world.site.url}/flows/{flow}")
        driver.execute_script("window.openedOnce = true;")
        assert atom_states(driver)["first"] == states.RUNNING  # the state so far, from the store
        assert atom_states(driver)["last"] == states.PENDING
        wait_for(lambda: texts(driver, "#live-status") == ["live"], "the page to go live")
        screenshot(driver, "flow-running")
        world.gate.touch()
        wait_for(lambda: set(atom_states(driver).values()) == {states.SUCCESS},
                 "every atom to turn SUCCESS on the page")
        wait_for(lambda: texts(driver, "#flow-state") == [states.SUCCESS],
                 "the flow to show SUCCESS")
        assert driver.execute_script("return window.openedOnce === true;"), \
            "the page must follow by itself, not be reloaded"
        titles = list(driver.execute_script(
            "return Array.from(document.querySelectorAll('#timeline .bar'), b => b.title);"))
        assert len(titles) >= 4 and all(" on " in title for title in titles), titles
        screenshot(driver, "flow")
    finally:
        world.gate.touch()
        runner.join(timeout=60.0)
    assert not runner.is_alive()


def test_flows_page_and_a_failed_flow(world: World) -> None:
    driver = world.driver
    driver.get(f"{world.site.url}/flows")
    assert world.stored["exploding"] in driver.page_source
    screenshot(driver, "flows")
    driver.get(f"{world.site.url}/flows/{world.stored['exploding']}")
    assert "cannot reach the API with ***" in driver.page_source
    assert PASSWORD not in driver.page_source
    screenshot(driver, "flow-failed")


def _park(world: World, topic: str) -> tuple[str, Any]:
    letters = dead_letters.DeadLetters(**world.broker)
    letters.list()  # declares the dead letters' queue
    letters.close()
    parker = proxy.Proxy("parker", world.broker["exchange"], transport="flowengine-fs",
                         transport_options=world.broker["transport_options"])
    request = protocol.Request(df.Provision("resize"), uuid.uuid4().hex, protocol.EXECUTE, {})
    dead_letters.park(parker, request, {protocol.HEADER_REQUEST_ID: request.request_id},
                      "lost on worker-1 and worker-2", topic, ["worker-1", "worker-2"], "gone")
    return request.request_id, parker


def test_a_dead_letter_is_requeued_through_the_page(world: World) -> None:
    letter, parker = _park(world, "parked")
    driver = world.driver
    try:
        driver.get(f"{world.site.url}/dead-letters")
        assert "lost on worker-1 and worker-2" in driver.page_source
        screenshot(driver, "dead-letters")
        click(driver, f'tr[data-letter="{letter}"] button.requeue', "the letter's Requeue")
        notice = wait_for(lambda: css(driver, "#notice"), "the requeue notice")
        assert "requeued resize" in notice[0].text
        assert not css(driver, "tr[data-letter]")
        [back] = parker.browse("parked")
        assert back.headers[protocol.HEADER_REQUEST_ID] == letter
    finally:
        parker.close()


def _post_status(driver: Any, path: str) -> int:
    return int(driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({csrf_token: 'x'})})"
        ".then(r => done(r.status)).catch(() => done(-1));", path))


def test_read_only_and_token_protected_dashboards_refuse_actions(world: World) -> None:
    letter, parker = _park(world, "parked-ro")
    parker.close()
    driver = world.driver
    data = DashboardData(world.store, EventHub(None), world.broker)
    with Site(create_app(data, read_only=True)) as site:
        driver.get(f"{site.url}/dead-letters")
        assert letter in driver.page_source and not css(driver, "button")
        assert css(driver, "#read-only")
        assert _post_status(driver, f"/dead-letters/{letter}/requeue") == 403
        screenshot(driver, "read-only")
    with Site(create_app(data, token=TOKEN)) as site:
        driver.get(f"{site.url}/flows")
        assert "needs its token" in driver.page_source
        assert _post_status(driver, f"/dead-letters/{letter}/discard") == 401
        driver.get(f"{site.url}/flows?token={TOKEN}")
        assert css(driver, "table#flows") and TOKEN not in driver.current_url
    assert [d["id"] for d in data.dead_letters()] == [letter], "nothing was changed"


def test_a_trashed_job_is_reposted_through_the_jobs_page(world: World, redis_url: str) -> None:
    namespace = f"fe-dash-{uuid.uuid4().hex[:10]}"
    board = make_redis_board(redis_url, namespace)
    board.connect()
    try:
        running = board.post("nightly-backup", details={})
        board.claim(running, "conductor-a")
        board.post("send-invoices", details={})
        trashed = board.post("resize-volume", details={})
        for attempt in range(3):  # a job whose conductor died each time: trashed by the board
            board.claim(trashed, f"conductor-{'abc'[attempt]}")
            board.abandon(trashed, f"conductor-{'abc'[attempt]}")
        for name, host, pid in (("conductor-a", "host-1", 4101), ("conductor-b", "host-2", 4102)):
            board.register_entity(Entity("conductor", f"{name}@{host}:{pid}",
                                         {"hostname": host, "pid": pid, "engine": "parallel"}))
        assert [t.uuid for t in board.iter_trash()] == [trashed.uuid]
        driver = world.driver
        hub = EventHub(lambda: EventReceiver(**world.broker))
        with Site(create_app(DashboardData(world.store, hub, board=board))) as site:
            wait_for(hub.listening.is_set, "the dashboard to follow the event stream")
            driver.get(f"{site.url}/jobs")
            assert "abandoned or orphaned 3 times" in driver.page_source
            assert len(css(driver, "#conductors tr[data-conductor]")) == 2
            screenshot(driver, "jobs")
            click(driver, f'tr[data-trashed="{trashed.uuid}"] button.repost', "Re-post")
            notice = wait_for(lambda: css(driver, "#notice"), "the re-post notice")
            assert "re-posted job 'resize-volume'" in notice[0].text
            assert not css(driver, "tr[data-trashed]")
            row = texts(driver, f'tr[data-job="{trashed.uuid}"]')
            assert len(row) == 1 and states.UNCLAIMED in row[0], row
        assert board.iter_trash() == []
    finally:
        board.close()
        wipe_redis(redis_url, namespace)
