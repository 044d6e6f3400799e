"""One factory per jobboard backend, for the board and conductor suites.

Every backend has two functions with the same shape:

* ``make_<backend>_board(server, namespace, *, name="board", persistence=None, **options)``
  builds an UNCONNECTED board on ``server`` (what the backend's server fixture gives: a Redis
  URL, ZooKeeper hosts, an etcd ``(host, port)``) whose data all lives under ``namespace``
  (a unique string per test); ``options`` are extra conf keys (``claim_ttl``, ``max_attempts``).
  Two boards made with the same server and namespace see the same jobs.
* ``wipe_<backend>(server, namespace)`` deletes everything stored under ``namespace``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowengine.jobs.base import JobBoard

#: What the ``board_factory`` fixture gives: makes a connected board from conf keys. (Tests
#: import it from here: every test folder has a ``conftest`` module, so importing one by name
#: would find whichever was loaded first.)
BoardFactory = Callable[..., JobBoard]


def make_redis_board(server: str, namespace: str, *, name: str = "board",
                     persistence: Any = None, **options: Any) -> JobBoard:
    """A Redis board at ``server`` (a ``redis://`` URL) keyed under ``namespace``."""
    from flowengine.jobs.backends import fetch

    return fetch(name, {"board": server, "namespace": namespace, **options},
                 persistence=persistence)


def wipe_redis(server: str, namespace: str) -> None:
    """Delete every key of ``namespace``."""
    import redis

    client = redis.Redis.from_url(server)
    try:
        keys = list(client.scan_iter(match=f"{namespace}:*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def redis_keys(server: str, prefix: str) -> list[bytes]:
    """The keys starting with ``prefix``."""
    import redis

    client = redis.Redis.from_url(server)
    try:
        return list(client.scan_iter(match=f"{prefix}*", count=500))
    finally:
        client.close()


def make_zookeeper_board(server: str, namespace: str, *, name: str = "board",
                         persistence: Any = None, **options: Any) -> JobBoard:
    """A ZooKeeper board on ``server`` (``host:port`` list) under path ``/<namespace>/jobs``
    (its trash and entities are ``/<namespace>/.trash`` and ``/<namespace>/.entities``)."""
    from flowengine.jobs.backends import fetch

    return fetch(name, {"board": "zookeeper", "hosts": server, "path": f"/{namespace}/jobs",
                        **options}, persistence=persistence)


def wipe_zookeeper(server: str, namespace: str) -> None:
    """Delete the ``/<namespace>`` tree."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=server)
    client.start(timeout=15)
    try:
        client.delete(f"/{namespace}", recursive=True)
    except Exception:  # noqa: BLE001 - nothing there to delete
        pass
    finally:
        client.stop()
        client.close()


def zookeeper_exists(server: str, path: str) -> bool:
    """Whether the node ``path`` exists."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=server)
    client.start(timeout=15)
    try:
        return client.exists(path) is not None
    finally:
        client.stop()
        client.close()


#: Where an etcd board's jobs, trashed jobs and entities live (the board path follows).
ETCD_ROOTS = ("/taskflow/jobs/", "/taskflow/.trash/", "/taskflow/.entities/")


def make_etcd_board(server: tuple[str, int], namespace: str, *, name: str = "board",
                    persistence: Any = None, **options: Any) -> JobBoard:
    """An etcd board on ``server`` (host, port) with path ``namespace``: its keys are under
    ``/taskflow/jobs/<namespace>/``, ``/taskflow/.trash/<namespace>/`` and
    ``/taskflow/.entities/<namespace>/`` (TaskFlow's layout)."""
    from flowengine.jobs.backends import fetch

    host, port = server
    return fetch(name, {"board": "etcd", "host": host, "port": port, "path": namespace,
                        **options}, persistence=persistence)


def wipe_etcd(server: tuple[str, int], namespace: str) -> None:
    """Delete every key of the board with path ``namespace``."""
    import etcd3gw

    client = etcd3gw.Etcd3Client(host=server[0], port=server[1], timeout=10)
    for root in ETCD_ROOTS:
        client.delete_prefix(f"{root}{namespace}/")


def etcd_keys(server: tuple[str, int], path: str) -> list[str]:
    """The keys of boards whose path starts with ``path``, in all three roots."""
    import etcd3gw

    client = etcd3gw.Etcd3Client(host=server[0], port=server[1], timeout=10)
    found: list[str] = []
    for root in ETCD_ROOTS:
        found += [str(meta["key"]) for _value, meta in client.get_prefix(f"{root}{path}")]
    return found
