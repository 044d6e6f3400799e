"""Building and finishing kazoo (ZooKeeper) clients from a jobboard's conf; TaskFlow's names.

Needs the ``zookeeper`` extra (kazoo).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

try:
    from kazoo import client as k_client
    from kazoo import exceptions as k_exc
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError("The ZooKeeper jobboard needs the kazoo client: "
                      "pip install 'flowengine[zookeeper]'") from err

from flowengine import exceptions as exc

__all__ = ["CLIENT_LOG", "CONF_TRANSFERS", "KazooClient", "KazooTransactionException",
           "check_compatible", "checked_commit", "finalize_client", "make_client"]

LOG = logging.getLogger(__name__)


class _NoTracing(logging.Filter):
    """Drops kazoo's request and response tracing (below INFO): it shows node data, and job
    details in node data may hold secrets."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.INFO


#: The logger clients made here log to (kazoo's own warnings and errors only).
CLIENT_LOG = logging.getLogger("flowengine.kazoo")
CLIENT_LOG.addFilter(_NoTracing())

DEFAULT_HOSTS = "localhost:2181"


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")


#: Conf keys passed on to :class:`kazoo.client.KazooClient`, with their converters (TaskFlow's).
CONF_TRANSFERS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("read_only", _flag), ("randomize_hosts", _flag), ("keyfile", str),
    ("keyfile_password", str), ("certfile", str), ("ca", str), ("use_ssl", _flag),
    ("verify_certs", _flag), ("timeout", float), ("command_retry", lambda v: v),
    ("connection_retry", lambda v: v), ("handler", lambda v: v),
)


def _hosts(value: Any) -> str:
    """``host:port,...`` from a string, a list of ``host:port`` or a ``{host: port}`` dict."""
    if isinstance(value, dict):
        value = [f"{host}:{port}" for host, port in value.items()]
    if isinstance(value, (list, tuple, set)):
        value = ",".join(str(host) for host in value)
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"ZooKeeper hosts must be a non-empty 'host:port,...' string, a list or"
                        f" a dict, not {value!r}")
    return value.strip()


class KazooClient(k_client.KazooClient):
    """A :class:`kazoo.client.KazooClient` whose :meth:`close` stops it first if it still runs
    (kazoo's refuses, so ``contextlib.closing(client)`` would fail)."""

    def close(self) -> None:
        """Stop the client if needed, then release its resources."""
        if not self._stopped.is_set():
            self.stop()
        super().close()


def make_client(conf: dict[str, Any]) -> KazooClient:
    """An unstarted :class:`KazooClient` for ``conf``.

    Keys read: ``hosts`` (string, list or dict; ``localhost:2181`` by default), ``timeout``
    (the session timeout in seconds: how long a silent client keeps its ephemeral nodes),
    ``read_only``, ``randomize_hosts``, ``command_retry``, ``connection_retry``, ``handler`` and
    the SSL keys ``use_ssl``, ``verify_certs``, ``certfile``, ``keyfile``, ``keyfile_password``
    and ``ca``.

    Raises:
        TypeError: If ``hosts`` is not usable (the message shows it).
    """
    kwargs: dict[str, Any] = {"hosts": _hosts(conf.get("hosts") or DEFAULT_HOSTS),
                              "logger": CLIENT_LOG}
    for key, convert in CONF_TRANSFERS:
        if conf.get(key) is not None:
            kwargs[key] = convert(conf[key])
    return KazooClient(**kwargs)


def finalize_client(client: k_client.KazooClient) -> None:
    """Stop and close ``client``, started or not (its ephemeral nodes go at once)."""
    client.stop()
    client.close()


class KazooTransactionException(k_exc.KazooException):
    """A ZooKeeper transaction was refused; :attr:`failures` pairs each failed operation with
    its error.
    """

    def __init__(self, message: str, failures: Iterable[tuple[Any, Exception]]) -> None:
        super().__init__(message)
        self.failures: tuple[tuple[Any, Exception], ...] = tuple(failures)


def checked_commit(txn: Any) -> list[Any]:
    """Commit a kazoo transaction and raise if any of its operations failed.

    kazoo returns failures as values in the result list instead of raising them.

    Raises:
        KazooTransactionException: Naming each failed operation's kind and path (never its data).
    """
    if not txn.operations:
        return []
    results: Sequence[Any] = txn.commit()
    failures = [(op, result) for op, result in zip(txn.operations, results, strict=False)
                if isinstance(result, Exception)]
    if failures or len(results) != len(txn.operations):
        shown = ", ".join(f"{type(result).__name__} on {type(op).__name__}({op.path!r})"
                          for op, result in failures)
        raise KazooTransactionException(
            f"ZooKeeper transaction of {len(txn.operations)} operations failed: "
            f"{shown or f'{len(results)} results'}", failures)
    return list(results)


def check_compatible(client: k_client.KazooClient,
                     min_version: Sequence[int] | None = None,
                     max_version: Sequence[int] | None = None) -> None:
    """Raise unless the server's version is within ``[min_version, max_version]``.

    Servers that refuse the ``envi`` four-letter command (``4lw.commands.whitelist``) cannot
    tell their version; they are accepted, with a debug log.

    Raises:
        flowengine.exceptions.IncompatibleVersion: Naming the server's and the required version.
    """
    try:
        version = tuple(int(part) for part in client.server_version())
    except k_exc.KazooException as err:
        LOG.debug("ZooKeeper did not tell its version (%s); assuming it is recent enough", err)
        return
    shown = ".".join(str(part) for part in version)
    if min_version and version < tuple(min_version):
        raise exc.IncompatibleVersion(f"ZooKeeper {shown} is too old: flowengine needs >= "
                                      f"{'.'.join(str(p) for p in min_version)}")
    if max_version and version > tuple(max_version):
        raise exc.IncompatibleVersion(f"ZooKeeper {shown} is too new: flowengine needs <= "
                                      f"{'.'.join(str(p) for p in max_version)}")
