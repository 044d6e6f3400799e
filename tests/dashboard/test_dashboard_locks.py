"""Locks and limits on the dashboard: the jobs page lists who holds each lock and who waits, a
flow page shows the locks its flow holds and the tasks that wait (not as RUNNING)."""

from __future__ import annotations

import re
import threading
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from jobs.boards import make_redis_board, wipe_redis  # tests/ is on sys.path

from flowengine import coordination, engines, task
from flowengine.dashboard import DashboardData, EventHub, create_app
from flowengine.flows import linear_flow
from flowengine.jobs.base import JobBoard
from flowengine.persistence import base

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's note about httpx's successor
    from starlette.testclient import TestClient

GATE = threading.Event()
STARTED = threading.Event()


class Reboot(task.Task):
    def execute(self) -> None:
        STARTED.set()
        assert GATE.wait(30), "the test never opened the gate"


@pytest.fixture
def board(redis_url: str) -> Iterator[JobBoard]:
    namespace = f"fe-dash-locks-{uuid.uuid4().hex[:10]}"
    made = make_redis_board(redis_url, namespace)
    made.connect()
    yield made
    made.close()
    wipe_redis(redis_url, namespace)


def _run(engine: Any) -> threading.Thread:
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    return thread


def test_pages_show_who_holds_each_lock_and_what_waits(store: base.Backend,
                                                       board: JobBoard) -> None:
    GATE.clear()
    STARTED.clear()
    coordinator = coordination.for_board(board, owner="conductor-a")
    options = {"backend": store, "coordination": coordinator, "concurrency": {"Reboot": 1}}
    holder = engines.load(linear_flow.Flow("holder").add(Reboot("reboot-a")), locks=["lb:7"],
                          **options)
    waiter = engines.load(linear_flow.Flow("waiter").add(Reboot("reboot-b")), **options)
    threads = [_run(holder)]
    try:
        assert STARTED.wait(30)
        threads.append(_run(waiter))
        with TestClient(create_app(DashboardData(store, EventHub(None), board=board))) as app:
            deadline = threading.Event()
            page = app.get("/jobs").text
            while ">waiting</span>" not in page and not deadline.wait(0.05):  # another thread
                page = app.get("/jobs").text
            assert re.search(r'data-lock="lb:7" data-position="0">.*?lock.*?held.*?flow holder',
                             page, re.S), page
            assert re.search(r'data-lock="Reboot" data-position="1">.*?limit.*?waiting.*?'
                             r'task reboot-b of conductor-a', page, re.S), page
            held = app.get(f"/flows/{holder.storage.flow_uuid}").text
            assert 'id="locks-held">holds lock lb:7</span>' in held
            waiting = app.get(f"/flows/{waiter.storage.flow_uuid}").text
            assert 'data-atom="reboot-b" data-state="WAITING">WAITING</span>' in waiting
            assert re.search(r"for limit &#39;Reboot&#39; 1 at once \(held by flow holder",
                             waiting), waiting
    finally:
        GATE.set()
        for thread in threads:
            thread.join(30)
        coordinator.close()
