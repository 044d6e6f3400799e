"""What a broker tells about its queues: their names and what waits in them.

beanstalkd tells everything (``stats-tube``: ready, reserved, delayed, watching connections);
AMQP brokers tell ready messages and consumers of a queue named; Redis and flowengine-fs tell
ready messages. What a broker cannot tell is None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from flowengine.worker_based.broker.connection import TransportSpec, connect


class QueuesNotListed(ValueError):
    """The broker cannot list its queues (the message names its transport)."""


@dataclasses.dataclass(frozen=True)
class QueueCounts:
    """What waits in one queue: None where the broker cannot tell."""

    ready: int | None
    running: int | None
    delayed: int | None
    consumers: int | None


class QueueInspector:
    """One connection to the broker for looking at its queues (a context manager).

    Args:
        url, transport, transport_options: Broker settings, as for
            :class:`~flowengine.worker_based.broker.proxy.Proxy`.
    """

    def __init__(self, url: str | None = None, transport: TransportSpec | None = None,
                 transport_options: Mapping[str, Any] | None = None) -> None:
        self._conn, _ = connect(url, transport, dict(transport_options or {}))
        self._channel: Any = None

    def __enter__(self) -> QueueInspector:
        self._conn.__enter__()
        self._channel = self._conn.channel()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._conn.__exit__(kind, error, trace)

    @property
    def _amqp(self) -> bool:
        return bool(self._conn.transport.driver_type == "amqp")

    def names(self, prefix: str) -> list[str]:
        """The queues whose names start with ``prefix``.

        Raises:
            QueuesNotListed: The broker cannot list its queues.
        """
        listing = getattr(self._channel, "queues", None)
        if not callable(listing):  # kombu's memory channel has a ``queues`` dict, no listing
            raise QueuesNotListed(str(self._conn.transport.driver_type))
        return list(listing(prefix))

    def counts(self, queue: str) -> QueueCounts:
        """What waits in ``queue`` (a queue that does not exist holds nothing)."""
        tube = getattr(self._channel, "queue_stats", None)
        if tube is not None:  # beanstalkd
            stats = tube(queue)
            return QueueCounts(stats["ready"], stats["reserved"], stats["delayed"],
                               stats["watching"])
        conn = self._conn
        try:
            # A channel each: an AMQP broker closes the channel a passive declare fails on.
            with conn.channel() as own:
                declared = own.queue_declare(queue, passive=True)
        except conn.channel_errors:  # no such queue (yet): nothing waits in it
            return QueueCounts(0, None, None, 0 if self._amqp else None)
        return QueueCounts(int(declared.message_count), None, None,
                           int(declared.consumer_count) if self._amqp else None)
