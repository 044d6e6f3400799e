"""What each board backend shows a TaskFlow user beyond the shared contract, on real servers:
the Redis version check and client options, the ZooKeeper job node's exact posting, etcd's key
helpers.

``tests/conformance/test_taskflow_unit_tests.py`` runs TaskFlow's own board tests; these pin the
same facts on flowengine's own fixtures, with a reason when one breaks.
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid

import pytest
from boards import make_etcd_board, make_redis_board, make_zookeeper_board, wipe_zookeeper

from flowengine import exceptions as exc
from flowengine.jobs.backends import impl_redis, impl_zookeeper
from flowengine.persistence import models
from flowengine.utils import redis_utils


def test_redis_boards_refuse_a_server_older_than_they_need(redis_url: str) -> None:
    board = make_redis_board(redis_url, f"fe-test-{uuid.uuid4().hex[:12]}")
    assert isinstance(board, impl_redis.RedisJobBoard)
    assert board._client is not None
    new_enough, version = redis_utils.is_server_new_enough(board._client, (2, 6))
    assert new_enough and version.split(".")[0].isdigit()
    assert redis_utils.is_server_new_enough(board._client, (999,)) == (False, version)
    assert redis_utils.is_server_new_enough(board._client, (2, 6), prior_version="") == (
        True, version)
    assert redis_utils.is_server_new_enough(board._client, (3,), prior_version="2.8.1") == (
        False, "2.8.1")
    board.MIN_REDIS_VERSION = (999,)
    with pytest.raises(exc.IncompatibleVersion, match=f"999 or later, not {version}"):
        board.connect()
    assert not board.connected


def test_redis_boards_do_not_ask_for_redis_8s_maintenance_notifications(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # redis-py 8 asks every new connection for them; a Redis before 8 refuses, and redis-py
    # logs it, once per connection (TaskFlow's bug 2155236). Boards reconnect on their own.
    board = make_redis_board(redis_url, f"fe-test-{uuid.uuid4().hex[:12]}")
    with caplog.at_level(logging.DEBUG, logger="redis"):
        board.connect()
        try:
            board.post("j")
        finally:
            board.close()
    assert not [r for r in caplog.records if "maintenance notifications" in r.getMessage()]


def test_a_zookeeper_job_node_holds_taskflows_posting_alone(zookeeper_hosts: str) -> None:
    # TaskFlow's readers (and its tests) see {uuid, name, book, priority, details}; the dates
    # are the node's own ctime and mtime.
    namespace = f"fe-test-{uuid.uuid4().hex[:12]}"
    board = make_zookeeper_board(zookeeper_hosts, namespace)
    assert isinstance(board, impl_zookeeper.ZookeeperJobBoard)
    board.connect()
    try:
        book = models.LogBook("book-1")
        job = board.post("resize", book=book, details={"size": 3})
        [child] = [c for c in board._client.get_children(board.path) if c.startswith("job")]
        raw, stat = board._client.get(posixpath.join(board.path, child))
        assert json.loads(raw) == {"uuid": job.uuid, "name": "resize", "priority": "NORMAL",
                                   "details": {"size": 3},
                                   "book": {"name": "book-1", "uuid": book.uuid}}
        assert job.created_on is not None and job.last_modified is not None
        assert job.created_on.timestamp() == pytest.approx(stat.ctime / 1000.0)
        [seen] = list(board.iterjobs(ensure_fresh=True))
        assert seen.created_on == job.created_on
    finally:
        board.close()
        wipe_zookeeper(zookeeper_hosts, namespace)


def test_etcd_boards_read_and_count_keys_as_taskflows(etcd_endpoint: tuple[str, int]) -> None:
    board = make_etcd_board(etcd_endpoint, f"fe-test-{uuid.uuid4().hex[:12]}")
    board.connect()
    key = f"/fe-test/{uuid.uuid4().hex}"
    try:
        assert board.get_one(key) is None  # type: ignore[attr-defined]
        assert [board.incr(key) for _ in range(3)] == [1, 2, 3]  # type: ignore[attr-defined]
        assert board.get_one(key) == b"3"  # type: ignore[attr-defined]
    finally:
        board._client.delete(key)  # type: ignore[attr-defined]
        board.close()
