"""TaskFlow's jobs API surface without a server: conf parsing, priorities, masking, helpers."""

from __future__ import annotations

import pytest

from flowengine import engines, states, task
from flowengine import exceptions as exc
from flowengine import logging as fe_logging
from flowengine.flows import linear_flow
from flowengine.jobs import backends, base, masking
from flowengine.listeners.claims import CheckingClaimListener
from flowengine.types.entity import Entity


@pytest.mark.parametrize(("conf", "name", "expected"), [
    ("redis://:pw@10.0.0.1:6380/2?namespace=app", "redis",
     {"host": "10.0.0.1", "port": 6380, "password": "pw", "db": 2, "namespace": "app"}),
    ({"board": "zookeeper://h1:2181,h2:2181/taskflow/jobs", "timeout": 5}, "zookeeper",
     {"hosts": "h1:2181,h2:2181", "path": "/taskflow/jobs", "timeout": 5}),
    ({"board": "etcd", "host": "e", "port": 2379}, "etcd", {"host": "e", "port": 2379}),
])
def test_confs_and_uris_name_the_backend_and_its_options(conf: object, name: str,
                                                         expected: dict[str, object]) -> None:
    found, options = backends.split_conf(conf)  # type: ignore[arg-type]
    assert found == name
    assert {k: options[k] for k in expected} == expected


def test_a_conf_dict_keeps_its_keys_over_the_uris() -> None:
    _, options = backends.split_conf({"board": "redis://h:1/?namespace=uri", "namespace": "dict"})
    assert options["namespace"] == "dict"


def test_bad_confs_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="needs a 'board'"):
        backends.split_conf({"host": "x"})
    with pytest.raises(exc.NotFound, match="'carrier-pigeon'"):
        backends.fetch("b", {"board": "carrier-pigeon"})
    with pytest.raises(ValueError, match="claim_ttl"):
        base.BoardOptions.from_conf({"claim_ttl": "soon"})
    with pytest.raises(ValueError, match="claim_ttl must be > 0"):
        base.BoardOptions.from_conf({"claim_ttl": 0})
    assert base.BoardOptions.from_conf({"claim_ttl": "5", "max_attempts": "0"}) == \
        base.BoardOptions(5.0, 0)


def test_priorities_convert_and_reorder_as_taskflows() -> None:
    assert base.JobPriority.convert("very_low") is base.JobPriority.VERY_LOW
    with pytest.raises(ValueError, match="'urgent' is not a valid priority"):
        base.JobPriority.convert("urgent")
    assert base.JobPriority.reorder(("low", "a"), ("high", "b"), ("normal", "c")) == \
        ("b", "c", "a")
    assert base.JobPriority.reorder(("low", "only")) == "only"


def test_details_are_masked_for_display() -> None:
    shown = masking.masked({"store": {"db_password": "p", "api_key": "k", "size": 3,
                                      "url": "postgresql://u:pw@db/x"}})
    assert shown == {"store": {"db_password": "***", "api_key": "***", "size": 3,
                               "url": "postgresql://u:***@db/x"}}
    assert masking.scrub("login with p4ss failed", {"store": {"password": "p4ss"}}) == \
        "login with *** failed"


def test_entities_round_trip() -> None:
    entity = Entity("conductor", "c@h:1", {"pid": 1})
    assert Entity.from_dict(entity.to_dict()) == entity


def test_taskflow_logging_helpers() -> None:
    log = fe_logging.getLogger("flowengine.test")
    assert fe_logging.TRACE == fe_logging.BLATHER == 5
    log.trace("quiet")
    log.warn("loud")


class _Noop(task.Task):
    def execute(self) -> None:
        pass


class _Board:
    def __init__(self) -> None:
        self.owner: str | None = "me"

    def find_owner(self, job: object) -> str | None:
        return self.owner


class _Job:
    uuid = "j-1"
    state = states.CLAIMED


def test_checking_claim_listener_calls_back_once_the_claim_is_lost() -> None:
    engine = engines.load(linear_flow.Flow("f").add(_Noop("a"), _Noop("b")))
    board, lost = _Board(), []
    listener = CheckingClaimListener(engine, _Job(), board, "me",
                                     on_job_loss=lambda e, s, d: lost.append(s))
    with listener:
        engine.run()
    assert lost == []
    board.owner = "someone-else"
    engine.reset()
    with listener:
        engine.run()
    assert lost and lost[0] == states.RUNNING
    with pytest.raises(ValueError, match="callable"):
        CheckingClaimListener(engine, _Job(), board, "me", on_job_loss="no")  # type: ignore[arg-type]


def test_a_missing_redis_client_names_the_extra_to_install() -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['redis'] = None\n"
            "from flowengine.jobs import backends\n"
            "backends.fetch('b', 'redis://127.0.0.1:1/0')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "flowengine[redis]" in done.stderr


def test_redis_sentinels_may_be_ipv6_addresses() -> None:
    from flowengine.utils import redis_utils

    assert redis_utils._sentinel_address("[::1]:26379") == ("::1", 26379)
    assert redis_utils._sentinel_address("10.0.0.2:26380") == ("10.0.0.2", 26380)
    with pytest.raises(ValueError, match="'nowhere'"):
        redis_utils._sentinel_address("nowhere")


def test_a_redis_board_makes_its_client_when_built() -> None:
    # As TaskFlow's: a conf its client refuses fails at construction, not at first connect.
    from flowengine.jobs.backends import impl_redis

    board = impl_redis.RedisJobBoard("b", {"host": "127.0.0.1", "port": 1})
    assert board._client is not None and not board.connected
    assert impl_redis.RedisJobBoard.MIN_REDIS_VERSION == (2, 6)
    with pytest.raises(ValueError):
        impl_redis.RedisJobBoard("b", {"port": "not-a-port"})


@pytest.mark.parametrize("wait_timeout", ["testing", True, 0, -1.0])
def test_a_conductors_wait_timeout_must_be_a_positive_number(wait_timeout: object) -> None:
    from flowengine.conductors import backends as conductors

    board = backends.fetch("b", {"board": "redis", "host": "127.0.0.1", "port": 1})
    with pytest.raises(ValueError, match="wait_timeout"):
        conductors.fetch("nonblocking", "c", board, wait_timeout=wait_timeout)
