"""Finding a jobboard from a configuration dict or URI.

>>> with backends.backend("my-board", "redis://127.0.0.1:6379/0?namespace=app") as board:
...     job = board.post("resize-volume", book)  # doctest: +SKIP

The conf is a dict whose ``board`` key names the backend (``redis``, ``zookeeper``, ``etcd``) or
holds a URI, or a URI alone. A URI's scheme names the backend; its host, port, password, path
and query parameters become conf keys (``zookeeper://h1:2181,h2:2181/taskflow`` gives
``hosts`` and ``path``), without overriding keys the dict sets. Other names are looked up as
entry points in ``namespace``.
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
from collections.abc import Iterator
from typing import Any

from flowengine.jobs import base
from flowengine.persistence.base import Backend
from flowengine.utils import backend_conf

__all__ = ["BACKEND_NAMESPACE", "backend", "fetch", "split_conf"]

LOG = logging.getLogger(__name__)

#: The entry point group searched for boards flowengine does not know itself.
BACKEND_NAMESPACE = "flowengine.jobboards"

_BUILTIN = {
    "redis": "flowengine.jobs.backends.impl_redis:RedisJobBoard",
    "zookeeper": "flowengine.jobs.backends.impl_zookeeper:ZookeeperJobBoard",
    "zk": "flowengine.jobs.backends.impl_zookeeper:ZookeeperJobBoard",
    "etcd": "flowengine.jobs.backends.impl_etcd:EtcdJobBoard",
}


def _uri_conf(uri: str) -> tuple[str, dict[str, Any]]:
    parts = urllib.parse.urlsplit(uri)
    conf: dict[str, Any] = dict(urllib.parse.parse_qsl(parts.query))
    netloc = parts.netloc.rpartition("@")[2]
    if netloc:
        conf["hosts"] = netloc
        if "," not in netloc:
            host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "")
            conf["host"] = host
            if port:
                conf["port"] = int(port)
    if parts.password:
        conf["password"] = urllib.parse.unquote(parts.password)
    if parts.username:
        conf["username"] = urllib.parse.unquote(parts.username)
    path = parts.path.strip("/")
    if path:
        conf["path"] = "/" + path
        if path.isdigit():
            conf["db"] = int(path)
    return parts.scheme.lower(), conf


def split_conf(conf: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The backend name and the conf dict of a URI or conf dict (see the module's docstring).

    Raises:
        TypeError: If ``conf`` is neither a string nor a dict.
        ValueError: If it names no backend.
    """
    return backend_conf.split_conf(conf, "board", "Jobboard", _uri_conf)


def _load_class(name: str, namespace: str) -> type[base.JobBoard]:
    cls: type[base.JobBoard] = backend_conf.load_class(
        name, namespace, _BUILTIN, BACKEND_NAMESPACE, "jobboard backend named"
    )
    return cls


def fetch(name: str, conf: str | dict[str, Any], persistence: Backend | None = None,
          namespace: str = BACKEND_NAMESPACE, **kwargs: Any) -> base.JobBoard:
    """Build (not connect) the board ``conf`` names.

    Args:
        name: The board's name.
        conf: A conf dict or URI (see the module's docstring).
        persistence: The persistence backend jobs' logbooks are loaded from.
        namespace: The entry point group searched for other backends.
        **kwargs: Passed to the board's constructor (``client=`` an existing client).

    Raises:
        flowengine.exceptions.NotFound: If no backend has that name.
        ImportError: If the backend's client library is missing (names the extra to install).
    """
    board, options = split_conf(conf)
    cls = _load_class(board, namespace)
    LOG.debug("Using %s for jobboard %r", cls.__name__, name)
    made: base.JobBoard = cls(name, options, persistence=persistence, **kwargs)
    return made


@contextlib.contextmanager
def backend(name: str, conf: str | dict[str, Any], persistence: Backend | None = None,
            namespace: str = BACKEND_NAMESPACE, **kwargs: Any) -> Iterator[base.JobBoard]:
    """Fetch a board, connect it, yield it, and close it afterwards (as for :func:`fetch`)."""
    board = fetch(name, conf, persistence=persistence, namespace=namespace, **kwargs)
    board.connect()
    with contextlib.closing(board):
        yield board
