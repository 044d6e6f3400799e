"""The in-process memory transport with connections a test can cut, as a killed process's are.

:mod:`flowengine.testing` runs workers on threads of the test process, over the memory transport
(:mod:`.transport_memory`). To lose one of them the way a worker process killed with SIGKILL is
lost, every connection it made is *severed* at once: from then on whatever it publishes
(outcomes, RUNNING replies, heartbeats, announcements, events) is dropped, nothing more is
delivered to it, and the requests it had taken without acknowledging them go back to their
queue marked redelivered, as a broker does when a dead consumer's connection drops. Its threads
may go on running; nothing they do reaches anyone.

Connections belong to a *line*, named by the transport option :data:`LINE_OPTION` (a worker
given ``transport=Transport, transport_options={LINE_OPTION: "w1"}`` has every connection on
line ``w1``). :func:`sever` cuts a line. Everything else is :mod:`.transport_memory`'s, so a
connection made with plain ``transport="memory"`` in the same process (an engine's) sees the
same exchanges and queues.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any

from flowengine.worker_based.broker import transport_memory

#: The transport option naming a connection's line.
LINE_OPTION = "flowengine_line"

_lock = threading.Lock()
_severed: set[str] = set()
_channels: dict[str, weakref.WeakSet[Channel]] = {}


def sever(line: str) -> int:
    """Cut every connection of ``line``, now and to come; return how many requests it had
    taken unacknowledged, now back in their queues (marked redelivered)."""
    with _lock:
        _severed.add(line)
        channels = list(_channels.get(line, ()))
    returned = 0
    for channel in channels:
        returned += channel.give_back()
    return returned


def severed(line: str) -> bool:
    """Whether ``line`` was cut."""
    return line in _severed


def forget(line: str) -> None:
    """Drop what is known of ``line`` (its connections are closed and will not come back)."""
    with _lock:
        _severed.discard(line)
        _channels.pop(line, None)


class Channel(transport_memory.Channel):
    """A memory channel on a line: dead once its line is severed."""

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        options = getattr(connection.client, "transport_options", None) or {}
        self._line: str | None = options.get(LINE_OPTION)
        self._giving_back = False
        if self._line is not None:
            with _lock:
                _channels.setdefault(self._line, weakref.WeakSet()).add(self)

    @property
    def _cut(self) -> bool:
        return self._line is not None and self._line in _severed

    def give_back(self) -> int:
        """Put every unacknowledged message back in its queue, marked redelivered."""
        delivered = len(self.qos._delivered)
        self._giving_back = True
        try:
            self.qos.restore_unacked()
        finally:
            self._giving_back = False
        return delivered

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        if self._cut and not self._giving_back:
            return  # a dead process publishes nothing
        super()._put(queue, message, **kwargs)

    def _put_fanout(self, exchange: str, message: Any, routing_key: Any = None,
                    **kwargs: Any) -> None:
        if self._cut:
            return
        super()._put_fanout(exchange, message, routing_key, **kwargs)

    def _get(self, queue_name: str, timeout: float | None = None) -> Any:
        if self._cut:
            raise queue.Empty()  # nor does it receive anything
        return super()._get(queue_name, timeout)


class Transport(transport_memory.Transport):
    """:mod:`.transport_memory`'s transport over severable :class:`Channel` s."""

    Channel = Channel
