"""What a message handler receives: one delivered message as a frozen value.

Handlers above the broker package never see a kombu message: the dispatcher hands them a
:class:`Delivery`, which carries what was sent (decoded body, headers, properties) and settles
the message through its consumer (:meth:`Delivery.ack`, :meth:`~Delivery.requeue`,
:meth:`~Delivery.reject`, :meth:`~Delivery.touch`), from any thread.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

#: How a consumer settles a message it delivered: ``settler(message, action)`` with action
#: ``"ack"``, ``"requeue"`` or ``"reject"``.
Settler = Callable[[Any, str], None]


@dataclasses.dataclass(frozen=True, eq=False)
class Delivery:
    """One delivered message.

    A delivery built by hand (in tests, say) has no message behind it: settling it does nothing.

    Attributes:
        body: The decoded JSON body (None before it is decoded: seen by signature checks and
            refusal hooks).
        headers: The message headers (flowengine's extensions; a signature check may cap a
            claimed capacity in place before handlers see them).
        properties: The message properties (``type``, ``reply_to``, ``correlation_id``...).
        raw_body: The body as it came off the wire (what signatures cover).
        redelivered: Whether the broker delivered it before, to a consumer that never settled
            it.
        routing_key: The routing key it was published with, where the broker tells.
        tag: The broker's delivery tag, for log lines.
    """

    body: Any = None
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)
    properties: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))
    raw_body: bytes = b""
    redelivered: bool = False
    routing_key: str | None = None
    tag: Any = None
    _message: Any = dataclasses.field(default=None, repr=False)
    _settler: Settler | None = dataclasses.field(default=None, repr=False)

    @property
    def type(self) -> str | None:
        """The ``type`` property: which kind of message this is."""
        return self.properties.get("type")

    @property
    def correlation_id(self) -> str:
        """The ``correlation_id`` property: which request a reply answers ("" if none)."""
        return _text(self.properties.get("correlation_id"))

    @property
    def reply_to(self) -> str:
        """The ``reply_to`` property: the routing key replies go to ("" if none)."""
        return _text(self.properties.get("reply_to"))

    @property
    def acknowledged(self) -> bool:
        """Whether it is settled already (acked, requeued or rejected)."""
        return self._message is not None and bool(self._message.acknowledged)

    def ack(self) -> None:
        """Acknowledge it: the broker forgets it."""
        self._settle("ack")

    def requeue(self) -> None:
        """Give it back to its queue, for this or another consumer."""
        self._settle("requeue")

    def reject(self) -> None:
        """Drop it."""
        self._settle("reject")

    def touch(self) -> None:
        """Extend its time-to-run where the transport has one (beanstalkd's ``touch``);
        elsewhere nothing."""
        if self._message is None:
            return
        touch = getattr(self._message.channel, "touch", None)
        if touch is not None and not self._message.acknowledged:
            touch(self._message.delivery_tag)

    def _settle(self, action: str) -> None:
        if self._message is not None and self._settler is not None:
            self._settler(self._message, action)

    def describe(self) -> str:
        """A short, body-free description for log lines."""
        return (f"(type={self.type!r} correlation_id={self.properties.get('correlation_id')!r}"
                f" routing_key={self.routing_key!r} tag={self.tag})")


def of(message: Any, settler: Settler, body: Any = None) -> Delivery:
    """The :class:`Delivery` of a kombu ``message``, settled through ``settler``."""
    info = getattr(message, "delivery_info", None) or {}
    raw = message.body
    return Delivery(
        body=body,
        headers=message.headers if isinstance(message.headers, dict)
        else dict(message.headers or {}),
        properties=types.MappingProxyType(dict(message.properties or {})),
        raw_body=raw if isinstance(raw, bytes) else str(raw or "").encode(),
        redelivered=_redelivered(message, info),
        routing_key=info.get("routing_key"),
        tag=getattr(message, "delivery_tag", None),
        _message=message,
        _settler=settler,
    )


def message_of(delivery: Delivery) -> Any:
    """The kombu message behind ``delivery`` (None for one built by hand); broker package only."""
    return delivery._message


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _redelivered(message: Any, info: Mapping[str, Any]) -> bool:
    if info.get("redelivered"):  # AMQP's flag; kombu's Redis and flowengine-fs set it too
        return True
    # kombu's in-memory transport marks a message it restores on the stored envelope only.
    raw = getattr(message, "_raw", None)
    return isinstance(raw, dict) and bool(raw.get("redelivered"))
