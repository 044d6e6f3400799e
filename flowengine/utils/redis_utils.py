"""A Redis client that knows when it is closed, building one from a jobboard's conf, and
checking the server's version.

TaskFlow's names (``RedisClient``, ``is_server_new_enough``); needs the ``redis`` extra.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

try:
    import redis
    from redis import sentinel
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError("The Redis jobboard needs the redis client: "
                      "pip install 'flowengine[redis]'") from err

_maint: Any
try:  # redis-py 7 and later
    from redis import maint_notifications as _maint
except ImportError:  # pragma: no cover - depends on the installed redis-py
    _maint = None

__all__ = ["CLIENT_CONF_TRANSFERS", "RedisClient", "is_server_new_enough", "make_client"]


#: Retries (capped exponential backoff, about 10 s in all) of a command whose connection to the
#: master failed, on a client that finds the master through Sentinels: each retry connects anew,
#: asking the Sentinels, so a command sent during a failover reaches the promoted replica.
SENTINEL_RETRIES = 24
SENTINEL_RETRY_CAP = 0.5


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")


#: Conf keys passed on to the client, with their converters (TaskFlow's list).
CLIENT_CONF_TRANSFERS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("host", str), ("port", int), ("username", str), ("password", str), ("db", int),
    ("encoding", str), ("encoding_errors", str), ("socket_timeout", float),
    ("socket_connect_timeout", float), ("retry_on_timeout", _flag),
    ("health_check_interval", int), ("unix_socket_path", str), ("ssl", _flag),
    ("ssl_keyfile", str), ("ssl_certfile", str), ("ssl_cert_reqs", str), ("ssl_ca_certs", str),
)


class RedisClient(redis.Redis):
    """A :class:`redis.Redis` with a :attr:`closed` flag set by :meth:`close`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closed = False

    def close(self) -> None:
        """Close the connection pool and mark the client closed."""
        self.closed = True
        super().close()


def _sentinel_address(text: str) -> tuple[str, int]:
    """``(host, port)`` from ``host:port`` or ``[v6-address]:port``."""
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Redis sentinel {text!r} is not host:port")
    return host.removeprefix("[").removesuffix("]"), int(port)


def make_client(conf: dict[str, Any]) -> redis.Redis:
    """The client ``conf`` describes (``sentinel``: a master name found through sentinels at
    ``host:port`` and ``sentinel_fallbacks``, or at every ``host:port`` of ``hosts``, as a board
    URI such as ``redis://s1:26379,s2:26379,s3:26379/0?sentinel=mymaster`` gives them)."""
    client_conf = {key: convert(conf[key]) for key, convert in CLIENT_CONF_TRANSFERS
                   if conf.get(key) is not None}
    if not _flag(client_conf.get("ssl", False)):
        client_conf = {k: v for k, v in client_conf.items() if not k.startswith("ssl_")}
    if _maint is not None:
        # redis-py 8 asks every new connection for maintenance notifications, which servers
        # before Redis 8 refuse, with a log line per connection; boards reconnect on their own.
        client_conf["maint_notifications_config"] = _maint.MaintNotificationsConfig(
            enabled=False)
    if conf.get("sentinel"):
        sentinels = [(client_conf.pop("host", "127.0.0.1"), client_conf.pop("port", 26379))]
        listed = [h.strip() for h in str(conf.get("hosts") or "").split(",") if h.strip()]
        if len(listed) > 1:
            sentinels = [_sentinel_address(h) for h in listed]
        sentinels += [_sentinel_address(f) for f in conf.get("sentinel_fallbacks") or ()]
        sentinel_kwargs = conf.get("sentinel_kwargs")
        if sentinel_kwargs is not None and not _flag(sentinel_kwargs.get("ssl", False)):
            sentinel_kwargs = {k: v for k, v in sentinel_kwargs.items()
                               if not k.startswith("ssl_")}
        watcher = sentinel.Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs, **client_conf)
        master: redis.Redis = watcher.master_for(conf["sentinel"])
        # A command sent during a failover is retried while the Sentinels name the new master.
        # Set on the master's connections rather than passed to Sentinel(), whose arguments
        # are TaskFlow's (its tests check them), unless the conf chose its own retry.
        if "retry" not in client_conf:
            kwargs = master.connection_pool.connection_kwargs
            kwargs["retry"] = Retry(ExponentialBackoff(cap=SENTINEL_RETRY_CAP, base=0.05),
                                    SENTINEL_RETRIES)
            kwargs["retry_on_error"] = [redis.ConnectionError, redis.TimeoutError]
        return master
    return RedisClient(**client_conf)


def is_server_new_enough(client: redis.Redis, min_version: tuple[int, ...],
                         default: bool = False,
                         prior_version: str | None = None) -> tuple[bool, str]:
    """Whether the server ``client`` talks to is at least ``min_version``, and its version.

    Args:
        client: The client.
        min_version: The oldest version accepted, like ``(2, 6)``.
        default: The answer when the server does not tell its version.
        prior_version: A version already read (the server is then not asked).
    """
    version = prior_version
    if not version:
        try:
            version = str(client.info().get("redis_version", ""))
        except redis.ResponseError:  # INFO renamed or refused (a proxy in front of Redis)
            version = ""
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:3])
    if not parts:
        return default, version
    return parts >= tuple(min_version), version
