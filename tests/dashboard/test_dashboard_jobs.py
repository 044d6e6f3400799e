"""The jobs page on a real Redis jobboard: jobs, the trash with a re-post action, conductors,
and the locks and limits on the board's service (with the flows that hold and wait for them)."""

from __future__ import annotations

import re
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs.boards import make_redis_board, wipe_redis  # tests/ is on sys.path

from flowengine import coordination, engines, states, task
from flowengine.dashboard import DashboardData, EventHub, create_app
from flowengine.flows import linear_flow
from flowengine.jobs.base import Job, JobBoard
from flowengine.persistence import base
from flowengine.types.entity import Entity

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's note about httpx's successor
    from starlette.testclient import TestClient

#: A secret in a trash reason (an operator pasted a URL): the page must mask it.
SECRET = "hunter2-" + "x" * 8


@pytest.fixture
def board(redis_url: str) -> Iterator[JobBoard]:
    namespace = f"fe-dash-{uuid.uuid4().hex[:10]}"
    made = make_redis_board(redis_url, namespace)
    made.connect()
    yield made
    made.close()
    wipe_redis(redis_url, namespace)


def trashed_job(board: JobBoard, name: str = "nightly") -> Job:
    job = board.post(name, details={})
    board.claim(job, "c-1")
    board.trash(job, "c-1", reason=f"no engine could be made from redis://:{SECRET}@db:6379/0")
    return job


def page_client(store: base.Backend, board: JobBoard, **options: object) -> TestClient:
    return TestClient(create_app(DashboardData(store, EventHub(None), board=board),
                                 **options),  # type: ignore[arg-type]
                      follow_redirects=False)


def test_jobs_page_shows_jobs_trash_and_conductors(store: base.Backend,
                                                    board: JobBoard) -> None:
    claimed = board.post("backup", details={})
    board.claim(claimed, "c-1")
    waiting = board.post("report", details={})
    trashed = trashed_job(board)
    board.register_entity(Entity("conductor", "c-1@host-a:4242",
                                 {"hostname": "host-a", "pid": 4242, "engine": "parallel"}))
    with page_client(store, board) as app:
        assert 'href="/jobs"' in app.get("/flows").text
        page = app.get("/jobs").text
    assert re.search(rf'data-job="{claimed.uuid}".*?CLAIMED.*?c-1</td><td>1</td>', page, re.S)
    assert re.search(rf'data-job="{waiting.uuid}".*?UNCLAIMED.*?<td>-</td><td>0</td>', page,
                     re.S)
    assert re.search(rf'data-trashed="{trashed.uuid}".*?nightly.*?no engine could be made',
                     page, re.S)
    assert SECRET not in page
    assert f'action="/jobs/trash/{trashed.uuid}/repost"' in page
    assert re.search(r'data-conductor="c-1@host-a:4242".*?host-a.*?4242.*?parallel', page, re.S)


def test_a_trashed_job_is_reposted_with_the_csrf_token(store: base.Backend,
                                                        board: JobBoard) -> None:
    job = trashed_job(board)
    with page_client(store, board) as app:
        app.get("/jobs")
        token = str(app.cookies["flowengine_csrf"])
        path = f"/jobs/trash/{job.uuid}/repost"
        assert app.post(path, data={}).status_code == 403
        assert app.post(path, data={"csrf_token": token},
                        headers={"origin": "http://evil.example"}).status_code == 403
        assert [t.uuid for t in board.iter_trash()] == [job.uuid]
        done = app.post(path, data={"csrf_token": token})
        assert done.status_code == 303 and "re-posted+job" in done.headers["location"]
        again = app.post(path, data={"csrf_token": token})  # gone from the trash now
        assert again.status_code == 303 and "refused" in again.headers["location"]
        page = app.get("/jobs").text
    assert board.iter_trash() == [] and "the trash is empty" in page
    [back] = list(board.iterjobs(ensure_fresh=True))
    assert (back.uuid, back.state, back.attempts) == (job.uuid, states.UNCLAIMED, 0)


def test_read_only_hides_and_refuses_repost(store: base.Backend, board: JobBoard) -> None:
    job = trashed_job(board)
    with page_client(store, board, read_only=True) as app:
        page = app.get("/jobs").text
        token = str(app.cookies["flowengine_csrf"])
        refused = app.post(f"/jobs/trash/{job.uuid}/repost", data={"csrf_token": token})
    assert job.uuid in page and "/repost" not in page and "<form" not in page
    assert refused.status_code == 403 and "read-only" in refused.text
    assert [t.uuid for t in board.iter_trash()] == [job.uuid]


def test_no_board_no_jobs_page(store: base.Backend) -> None:
    with TestClient(create_app(DashboardData(store, EventHub(None)))) as app:
        assert app.get("/jobs").status_code == 404
        assert app.post("/jobs/trash/x/repost").status_code in (404, 405)
        assert 'href="/jobs"' not in app.get("/flows").text


def test_jobs_page_says_how_jobs_ended_and_lists_damaged_postings(
        store: base.Backend, board: JobBoard, redis_url: str, tmp_path: Path) -> None:
    import jobs.jobs_flows as jf  # tests/ is on sys.path
    import redis

    from flowengine.conductors import backends as conductors
    from flowengine.jobs.posting import post_flow

    board._persistence = store  # the conductor loads the jobs' logbooks from the page's store
    posted = [post_flow(board, store, jf.steps, factory_args=(1,)),
              post_flow(board, store, jf.reverting, store={"ledger": str(tmp_path / "l")})]
    conductor = conductors.fetch("blocking", "c-ends", board, persistence=store)
    finished = threading.Event()
    conductor.notifier.register("job_consumed", lambda *_a, **_k: finished.set()
                                if all(j.state == states.COMPLETE for j in posted) else None)
    runner = threading.Thread(target=conductor.run, daemon=True)
    runner.start()
    assert finished.wait(60)
    conductor.stop()
    runner.join(30)
    namespace = board._conf["namespace"]  # type: ignore[attr-defined]
    client = redis.Redis.from_url(redis_url)
    client.hset(f"{namespace}:jobs", "garbage-1", b"\x00 not a posting")
    client.close()
    with page_client(store, board) as app:
        page = app.get("/jobs").text
    assert re.search(rf'data-ended="{posted[0].uuid}".*?SUCCESS', page, re.S)
    assert re.search(rf'data-ended="{posted[1].uuid}".*?REVERTED.*?broken failed: '
                     rf'ValueError: broken on purpose', page, re.S)
    assert re.search(r'data-damaged="garbage-1".*?not JSON.*?yes', page, re.S)
    assert "not a posting" not in page


# ---- locks and limits -------------------------------------------------------------------------

GATE = threading.Event()
STARTED = threading.Event()


class Reboot(task.Task):
    def execute(self) -> None:
        STARTED.set()
        assert GATE.wait(30), "the test never opened the gate"


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
