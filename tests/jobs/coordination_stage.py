"""The coordination services of the lock and limit tests: one conf per real backend.

``coordination_conf`` gives, for each of Redis, ZooKeeper and etcd, a jobboard URI whose
namespace (or path) is the test's own, so its locks are too; what the test stored is deleted
when it ends. ``coordinators`` makes connected coordinators on it and closes them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from boards import wipe_etcd, wipe_redis, wipe_zookeeper
from servers import require_module

from flowengine import coordination

BACKENDS = ("redis", "zookeeper", "etcd")


def _wipe_etcd(endpoint: tuple[str, int], namespace: str) -> None:
    import etcd3gw

    wipe_etcd(endpoint, namespace)
    client = etcd3gw.Etcd3Client(host=endpoint[0], port=endpoint[1], timeout=10)
    client.delete_prefix(f"/taskflow/.coordination/{namespace}/")


def conf_for(request: pytest.FixtureRequest, backend: str,
             namespace: str) -> tuple[str, Callable[[], None]]:
    """The board URI of ``backend`` under ``namespace``, and what wipes it."""
    if backend == "redis":
        require_module("redis")
        url = request.getfixturevalue("redis_url")
        return f"{url}?namespace={namespace}", lambda: wipe_redis(url, namespace)
    if backend == "zookeeper":
        require_module("kazoo")
        hosts = request.getfixturevalue("zookeeper_hosts")
        return f"zookeeper://{hosts}/{namespace}/jobs", lambda: wipe_zookeeper(hosts, namespace)
    require_module("etcd3gw")
    endpoint = request.getfixturevalue("etcd_endpoint")
    return (f"etcd://{endpoint[0]}:{endpoint[1]}/{namespace}",
            lambda: _wipe_etcd(endpoint, namespace))


@pytest.fixture(params=BACKENDS)
def coordination_conf(request: pytest.FixtureRequest) -> Iterator[str]:
    """A board URI on each backend in turn, under a namespace of the test's own."""
    conf, wipe = conf_for(request, str(request.param), f"fe-coord-{uuid.uuid4().hex[:10]}")
    yield conf
    wipe()


Coordinators = Callable[..., coordination.Coordinator]


@pytest.fixture
def coordinators(coordination_conf: str) -> Iterator[Coordinators]:
    """Makes connected coordinators on ``coordination_conf`` (keyword arguments of
    :func:`flowengine.coordination.connect`); closes them all at the end."""
    made: list[coordination.Coordinator] = []

    def make(**kwargs: Any) -> coordination.Coordinator:
        coordinator = coordination.connect(coordination_conf, **kwargs)
        made.append(coordinator)
        return coordinator

    yield make
    for coordinator in made:
        coordinator.close()
