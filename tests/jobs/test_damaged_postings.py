"""Hostile postings: values in a board's job folder that are not jobs, beside good jobs.

On every backend (real Redis, ZooKeeper and etcd) a value that is not JSON, JSON that is not an
object, or an object whose fields have the wrong types is skipped by every reader, logged once
with the board and its key, listed by ``iter_damaged`` and ``flowengine jobs list``, and moved
to the trash unless somebody holds a claim on it; the good jobs run, on real ``flowengine
conductor`` processes that never exit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jobs_flows
import pytest
from board_stage import BoardStage
from boards import wipe_etcd, wipe_redis, wipe_zookeeper
from click.testing import CliRunner
from conductor_procs import Conductor, conductors, wait_for
from servers import require_module

from flowengine.cli.main import cli
from flowengine.jobs.base import JobBoard
from flowengine.jobs.records import DAMAGED_NAME

__all__ = ["conductors"]  # a fixture, imported for pytest

#: What a hostile (or broken) writer leaves in a board's job folder.
HOSTILE: tuple[bytes, ...] = (
    b"not json at all",
    b"[1, 2, 3]",
    b'"a string"',
    b"\xff\xfe\x00 not utf-8",
    b'{"uuid": 7, "name": "numbered"}',
    b'{"uuid": "DAMAGED-UUID", "name": "x", "details": "not an object"}',
    b'{"uuid": "DAMAGED-UUID", "name": "x", "priority": "URGENT!!"}',
    b'{"name": "no uuid"}',
    b'{"uuid": "DAMAGED-UUID", "name": "x", "book": ["not", "an", "object"]}',
)


class Planter:
    """Writes values straight into one backend's job folder, as a hostile writer would.

    ``plant(value, claimed)`` stores ``value`` where a job posting goes (with a claim on it
    when ``claimed``) and returns the key the board reports it under.
    """

    def __init__(self, plant: Callable[[bytes, bool], str], close: Callable[[], None]) -> None:
        self.plant, self.close = plant, close


def _redis_planter(url: str, namespace: str) -> Planter:
    import redis

    client = redis.Redis.from_url(url)

    def plant(value: bytes, claimed: bool) -> str:
        key = f"hostile-{uuid.uuid4().hex[:8]}"
        client.hset(f"{namespace}:jobs", key, value.replace(b"DAMAGED-UUID", key.encode()))
        if claimed:
            client.set(f"{namespace}:claim:{key}", "someone", px=600_000)
        return key

    return Planter(plant, client.close)


def _zookeeper_planter(hosts: str, path: str) -> Planter:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts)
    client.start(timeout=15)
    client.ensure_path(path)
    numbers = iter(range(900000000, 999999999))

    def plant(value: bytes, claimed: bool) -> str:
        node = f"{path}/job{next(numbers):010d}"
        client.create(node, value)
        if claimed:
            client.create(node + ".lock", b'{"owner": "someone"}', ephemeral=True)
        return node

    def close() -> None:
        client.stop()
        client.close()

    return Planter(plant, close)


def _etcd_planter(endpoint: tuple[str, int], path: str) -> Planter:
    import etcd3gw

    client = etcd3gw.Etcd3Client(host=endpoint[0], port=endpoint[1], timeout=10)
    numbers = iter(range(900000, 999999))

    def plant(value: bytes, claimed: bool) -> str:
        key = f"/taskflow/jobs/{path}/job{next(numbers)}"
        client.put(key + ".data", value)
        if claimed:
            client.put(key + ".lock", '{"owner": "someone"}')
        return key

    return Planter(plant, lambda: None)


@pytest.fixture(params=["redis", "zookeeper", "etcd"])
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[BoardStage,
                                                                               Planter]]:
    """A stage on each real backend (board URI, SQLite persistence, ledger) and its planter."""
    namespace = f"fe-hostile-{uuid.uuid4().hex[:10]}"
    options: dict[str, Any] = {"claim_ttl": 2.0}
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        stage = BoardStage(url, {**options, "namespace": namespace}, tmp_path,
                           lambda: wipe_redis(url, namespace))
        planter = _redis_planter(url, namespace)
    elif request.param == "zookeeper":
        require_module("kazoo")
        hosts = request.getfixturevalue("zookeeper_hosts")
        stage = BoardStage(f"zookeeper://{hosts}/{namespace}/jobs", options, tmp_path,
                           lambda: wipe_zookeeper(hosts, namespace))
        planter = _zookeeper_planter(hosts, f"/{namespace}/jobs")
    else:
        require_module("etcd3gw")
        endpoint = request.getfixturevalue("etcd_endpoint")
        stage = BoardStage(f"etcd://{endpoint[0]}:{endpoint[1]}/{namespace}", options,
                           tmp_path, lambda: wipe_etcd(endpoint, namespace))
        planter = _etcd_planter(endpoint, namespace)
    try:
        yield stage, planter
    finally:
        planter.close()
        stage.close()


def _fresh_board(stage: BoardStage) -> JobBoard:
    from flowengine.jobs import backends

    board = backends.fetch("reader", {"board": stage.board_uri, **stage.options})
    board.connect()
    return board


@pytest.mark.integration
def test_a_reader_skips_reports_once_and_trashes_damaged_postings(
        hostile: tuple[BoardStage, Planter], caplog: pytest.LogCaptureFixture) -> None:
    stage, planter = hostile
    good = [stage.post(jobs_flows.steps) for _ in range(2)]
    stage.board.close()  # it would see (and trash) them first
    planted = [planter.plant(value, False) for value in HOSTILE]
    held = planter.plant(b"claimed garbage", True)
    board = _fresh_board(stage)
    try:
        with caplog.at_level(logging.WARNING, logger="flowengine.jobs"):
            listed = [job.uuid for job in board.iterjobs(ensure_fresh=True)]
            again = [job.uuid for job in board.iterjobs(ensure_fresh=True)]
        assert sorted(listed) == sorted(again) == sorted(job.uuid for job in good)
        damaged = {d.key: d for d in board.iter_damaged()}
        assert set(damaged) == {*planted, held}
        assert all(damaged[key].trashed for key in planted) and not damaged[held].trashed
        assert "not JSON" in damaged[planted[0]].reason
        assert "not an object" in damaged[planted[1]].reason
        assert "not UTF-8" in damaged[planted[3]].reason
        for key in (*planted, held):  # logged once, naming the board and the key
            assert caplog.text.count(f"reader skipped a damaged posting at {key}:") == 1, key
        trash = [t for t in board.iter_trash() if t.name == DAMAGED_NAME]
        assert len(trash) == len(HOSTILE)
        assert all(t.reason.startswith("damaged posting: ") for t in trash)
    finally:
        board.close()
    # The trashed ones are gone for every reader; the claimed one stays, skipped.
    other = _fresh_board(stage)
    try:
        assert sorted(j.uuid for j in other.iterjobs(ensure_fresh=True)) == \
            sorted(job.uuid for job in good)
        assert [(d.key, d.trashed) for d in other.iter_damaged()] == [(held, False)]
    finally:
        other.close()


@pytest.mark.integration
def test_conductors_run_every_good_job_beside_hostile_postings(
        hostile: tuple[BoardStage, Planter], conductors: list[Conductor]) -> None:
    stage, planter = hostile
    planted = [planter.plant(value, False) for value in HOSTILE]
    held = planter.plant(b"claimed garbage", True)
    first = stage.conductor(conductors, "first")
    second = stage.conductor(conductors, "second")
    stage.wait_registered(first)
    stage.wait_registered(second)
    jobs = [stage.post(jobs_flows.steps) for _ in range(3)]
    planter.plant(b"{ broken", False)  # and one more while they run
    for job in jobs:
        assert job.wait(timeout=60), first.output() + second.output()
    assert sorted(jobs_flows.ledger_lines(stage.ledger)) == \
        ["step-1"] * 3 + ["step-2"] * 3 + ["step-3"] * 3
    late = stage.post(jobs_flows.steps)  # still taking jobs
    assert late.wait(timeout=60), first.output() + second.output()
    assert first.process.poll() is None and second.process.poll() is None
    for conductor in (first, second):
        assert "Traceback" not in conductor.output(), conductor.output()
    # Whichever board read them first (a conductor's, or this test's) moved them to the trash.
    wait_for(lambda: len([t for t in stage.board.iter_trash() if t.name == DAMAGED_NAME])
             == len(planted) + 1, 30, "every unclaimed damaged posting reaching the trash")
    result = CliRunner().invoke(cli, ["jobs", "list", "--board", stage.board_uri, "--json",
                                      *_options(stage)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [damaged] = [row for row in _json_lines(result.output) if row["state"] == "DAMAGED"]
    assert damaged["uuid"] == held and not damaged["trashed"]
    assert "claimed garbage" not in result.output
    text = CliRunner().invoke(cli, ["jobs", "list", "--board", stage.board_uri,
                                    *_options(stage)])
    assert text.exit_code == 0 and "damaged postings" in text.output, text.output


def _options(stage: BoardStage) -> list[str]:
    found: list[str] = []
    for key, value in stage.options.items():
        found += ["--board-option", f"{key}={value}"]
    return found


def test_a_posting_is_checked_field_by_field() -> None:
    from flowengine.jobs.records import PostingError, read_posting

    assert read_posting(b'{"uuid": "u", "name": "n"}')["name"] == "n"
    for raw, said in ((b"nope", "not JSON"), (b"[]", "a JSON array, not an object"),
                      (b'{"uuid": "u"}', "no 'name'"),
                      (b'{"uuid": "u", "name": "n", "created_on": "yesterday"}',
                       "'created_on' is not an ISO 8601 date"),
                      (b'{"uuid": "u", "name": "n", "book": {"uuid": 3}}',
                       "book's 'uuid' is a JSON number")):
        with pytest.raises(PostingError, match=said):
            read_posting(raw)
    with contextlib.suppress(PostingError):
        read_posting(b'{"uuid": "u", "name": "n", "details": {"password": "hunter2"}, '
                     b'"priority": 5}')
        raise AssertionError("a numeric priority was accepted")


def _json_lines(output: str) -> list[dict[str, Any]]:
    """The rows a ``--json`` command printed, one JSON object per line."""
    return [json.loads(line) for line in output.splitlines() if line.strip()]
