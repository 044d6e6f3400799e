"""Kombu's exchanges and bindings kept on a beanstalkd server, and kombu names as tube names.

beanstalkd has tubes and jobs only. So that every process routes alike, each binding is a tube
``kombu.binding.<exchange digest>.<binding digest>`` holding one job delayed for as long as
beanstalkd allows (it never becomes ready), whose JSON body names the exchange, routing key,
pattern and queue; ``list-tubes`` finds them. A tube exists while it holds a job or a connection
uses or watches it, so a channel goes back to ``default`` after it touched one. The binding
tube's name is a digest of the binding, so what a channel read of one never changes.

:class:`ServerBindings` is the part of :class:`~flowengine.worker_based.broker.transport_beanstalk.
Channel` that keeps them; the channel provides the connection (``_client``, ``_lock``,
``_use``, ``_drop``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable
from typing import Any

from kombu.transport import virtual

try:
    import greenstalk
except ImportError:  # pragma: no cover - the transport says which extra to install
    greenstalk = None  # type: ignore[assignment]

#: Seconds a channel routes by its copy of an exchange's bindings.
BINDING_CACHE_TTL = 1.0
#: beanstalkd's longest delay: binding records wait this long, i.e. for ever.
FOREVER = 2**32 - 1
BINDING_PREFIX = "kombu.binding."
MAX_TUBE_NAME = 200
_TUBE_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-+/;._()")
_Binding = tuple[str, str, str, str]  # exchange, routing key, pattern, queue


def tube_name(queue: str) -> str:
    """The beanstalkd tube of kombu queue ``queue`` (escaped, cut to 200 bytes)."""
    escaped = "".join(chr(b) if b in _TUBE_CHARS else f"${b:02x}" for b in queue.encode())
    if escaped.startswith("-"):
        escaped = "$2d" + escaped[1:]
    if len(escaped) > MAX_TUBE_NAME:
        digest = hashlib.sha1(queue.encode()).hexdigest()[:16]
        escaped = f"{escaped[:MAX_TUBE_NAME - 17]}${digest}"
    return escaped


def queue_name(tube: str) -> str | None:
    """The kombu queue of ``tube`` (None for a name :func:`tube_name` cut short)."""
    if len(tube) == MAX_TUBE_NAME and re.search(r"\$[0-9a-f]{16}$", tube):
        return None
    try:
        return re.sub(rb"\$([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]),
                      tube.encode()).decode()
    except UnicodeDecodeError:
        return None


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def binding_tube(exchange: str, routing_key: str, pattern: str, queue: str) -> str:
    """The tube that records one binding (a digest of each part: short and always valid)."""
    parts = "\0".join((routing_key, pattern, queue))
    return f"{BINDING_PREFIX}{_digest(exchange)}.{_digest(parts)}"


def exchange_prefix(exchange: str) -> str:
    """The common start of the names of ``exchange``'s binding tubes."""
    return f"{BINDING_PREFIX}{_digest(exchange)}."


class ServerBindings(virtual.Channel):
    """The bindings of a beanstalk channel, on the server (see the module's doc)."""

    binding_cache_ttl: float = BINDING_CACHE_TTL
    #: Monotonic clock of the binding cache (tests replace it on an instance).
    clock = staticmethod(time.monotonic)
    _client: Any
    _lock: Any
    _bindings: dict[str, _Binding]
    _routes: dict[str, tuple[float, list[tuple[str, str, str]]]]

    def _use(self, tube: str) -> None:
        raise NotImplementedError  # the channel's: make ``tube`` the connection's used tube

    def _drop(self, tube: str, peeks: Iterable[str]) -> int:
        raise NotImplementedError  # the channel's: delete the tube's jobs, peek by peek

    def queues(self, prefix: str = "") -> list[str]:
        """The queues whose tubes exist now (a tube exists while it holds jobs or is in use)
        and whose names start with ``prefix``."""
        with self._lock:
            tubes = self._client.tubes()
        names = (queue_name(tube) for tube in tubes if not tube.startswith(BINDING_PREFIX))
        return sorted(name for name in names if name is not None and name.startswith(prefix))

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        binding = (exchange, routing_key or "", pattern or "", queue)
        tube = binding_tube(*binding)
        self._routes.pop(exchange, None)
        with self._lock:
            stats = self._stats(tube)
            if stats is not None and stats["current-jobs-delayed"]:
                return  # recorded already (by this process or another)
            self._use(tube)
            record = dict(zip(("exchange", "routing_key", "pattern", "queue"), binding))
            self._client.put(json.dumps(record).encode(), delay=FOREVER, ttr=1)
            self._use("default")  # a tube lives while used: the binding's must not
        self._bindings[tube] = binding

    def queue_unbind(self, queue: str, exchange: str | None = None, routing_key: str = "",
                     arguments: Any = None, **kwargs: Any) -> None:
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        if exchange:
            meta = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
            self._unbind(binding_tube(exchange, *[m or "" for m in meta]))

    def exchange_delete(self, exchange: str, if_unused: bool = False, nowait: bool = False
                        ) -> None:
        super().exchange_delete(exchange, if_unused, nowait)
        for tube, binding in self._all_bindings().items():
            if binding[0] == exchange:
                self._unbind(tube)

    def _unbind(self, tube: str) -> None:
        binding = self._bindings.get(tube)
        if binding is not None:
            self._routes.pop(binding[0], None)
        self._drop(tube, ("peek_delayed", "peek_ready", "peek_buried"))

    def _stats(self, tube: str) -> Any:
        try:
            return self._client.stats_tube(tube)
        except greenstalk.NotFoundError:
            return None

    def _all_bindings(self, exchange: str | None = None) -> dict[str, tuple[str, str, str, str]]:
        """Every binding on the server (of ``exchange`` only, if given): tube -> binding."""
        prefix = BINDING_PREFIX if exchange is None else exchange_prefix(exchange)
        found: dict[str, tuple[str, str, str, str]] = {}
        with self._lock:
            for tube in self._client.tubes():
                if not tube.startswith(prefix):
                    continue
                binding = self._bindings.get(tube) or self._read_binding(tube)
                if binding[3]:  # the tube's name is a digest of it: it never changes
                    found[tube] = self._bindings[tube] = binding
            self._use("default")  # a tube lives while used: the bindings' must not
        return found

    def _read_binding(self, tube: str) -> tuple[str, str, str, str]:
        self._use(tube)
        for peek in (self._client.peek_delayed, self._client.peek_ready,
                     self._client.peek_buried):
            try:
                record = json.loads(peek().body)
                return (str(record["exchange"]), str(record["routing_key"]),
                        str(record["pattern"]), str(record["queue"]))
            except greenstalk.NotFoundError:
                continue
            except (ValueError, KeyError, TypeError):
                break
        return ("", "", "", "")  # removed meanwhile, or not ours: never routes

    def _read_table(self, exchange: str) -> list[tuple[str, str, str]]:
        table = [(key, pattern, queue)
                 for _, key, pattern, queue in self._all_bindings(exchange).values()]
        self._routes[exchange] = (self.clock() + float(self.binding_cache_ttl), table)
        return table

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        return self._read_table(exchange)

    def _lookup(self, exchange: str, routing_key: str, default: str | None = None) -> Any:
        if exchange and self.typeof(exchange).type == "direct":
            cached = self._routes.get(exchange)
            if cached is not None and self.clock() < cached[0]:
                queues = {queue for key, _, queue in cached[1] if key == routing_key}
                if len(queues) == 1:
                    return list(queues)
        return super()._lookup(exchange, routing_key, default)

