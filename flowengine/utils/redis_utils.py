"""A Redis client that knows when it is closed, and building one from a jobboard's conf.

TaskFlow's names (``RedisClient``); needs the ``redis`` extra.
"""

from __future__ import annotations

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

__all__ = ["CLIENT_CONF_TRANSFERS", "RedisClient", "make_client"]


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
    host, _, port = str(text).rpartition(":")
    return host, int(port)


def make_client(conf: dict[str, Any]) -> redis.Redis:
    """The client ``conf`` describes (``sentinel``: a master name found through sentinels at
    ``host:port`` and ``sentinel_fallbacks``, or at every ``host:port`` of ``hosts``, as a board
    URI such as ``redis://s1:26379,s2:26379,s3:26379/0?sentinel=mymaster`` gives them)."""
    client_conf = {key: convert(conf[key]) for key, convert in CLIENT_CONF_TRANSFERS
                   if conf.get(key) is not None}
    if not _flag(client_conf.get("ssl", False)):
        client_conf = {k: v for k, v in client_conf.items() if not k.startswith("ssl_")}
    if conf.get("sentinel"):
        sentinels = [(client_conf.pop("host", "127.0.0.1"), client_conf.pop("port", 26379))]
        listed = [h.strip() for h in str(conf.get("hosts") or "").split(",") if h.strip()]
        if len(listed) > 1:
            sentinels = [_sentinel_address(h) for h in listed]
        sentinels += [_sentinel_address(f) for f in conf.get("sentinel_fallbacks") or ()]
        client_conf.setdefault("retry", Retry(ExponentialBackoff(cap=SENTINEL_RETRY_CAP,
                                                                 base=0.05), SENTINEL_RETRIES))
        client_conf.setdefault("retry_on_error", [redis.ConnectionError, redis.TimeoutError])
        watcher = sentinel.Sentinel(sentinels, sentinel_kwargs=conf.get("sentinel_kwargs"),
                                    **client_conf)
        master: redis.Redis = watcher.master_for(conf["sentinel"])
        return master
    return RedisClient(**client_conf)
