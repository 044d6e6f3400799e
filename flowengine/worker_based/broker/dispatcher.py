"""Route incoming messages by their ``type`` property, refusing anything malformed.

The dispatcher runs on the consumer thread and receives kombu messages *undecoded*, so that it can
refuse an oversized or wrongly typed body before parsing it. Every refusal is one log line with a
stable ``reason=`` code an operator can grep and count; no message can stop the consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from flowengine import exceptions as exc
from flowengine.worker_based import protocol as pr

LOG = logging.getLogger(__name__)

JSON_CONTENT_TYPE = "application/json"

# Stable reason codes (log field ``reason=``).
REASON_MISSING_TYPE = "missing-type"
REASON_UNKNOWN_TYPE = "unknown-type"
REASON_CONTENT_TYPE = "content-type"
REASON_TOO_LARGE = "too-large"
REASON_DECODE_ERROR = "decode-error"
REASON_TOO_DEEP = "too-deep"
REASON_INVALID_FORMAT = "invalid-format"
REASON_HANDLER_ERROR = "handler-error"

#: Gets (decoded body, message).
MessageCallback = Callable[[Any, Any], None]
#: Gets (data, message); a truthy answer requeues the message instead of processing it.
RequeueFilter = Callable[[Any, Any], Any]


class Handler(NamedTuple):
    """What to do with one message type.

    Attributes:
        process_message: Called with ``(data, message)`` once the body is valid.
        validator: Called with the body first; raises InvalidFormat to refuse it.
        manual_ack: If True, ``process_message`` settles the message itself (acks it once its
            outcome is published); otherwise the dispatcher acks it before processing.
    """

    process_message: MessageCallback
    validator: Callable[[Any], None] | None = None
    manual_ack: bool = False


def describe(message: Any) -> str:
    """A short, body-free description of ``message`` for log lines."""
    props = getattr(message, "properties", None) or {}
    info = getattr(message, "delivery_info", None) or {}
    return (
        f"(type={props.get('type')!r} correlation_id={props.get('correlation_id')!r}"
        f" routing_key={info.get('routing_key')!r} tag={getattr(message, 'delivery_tag', None)})"
    )


def redelivered(message: Any) -> bool:
    """Whether the broker delivered ``message`` before, to a consumer that never settled it."""
    info = getattr(message, "delivery_info", None) or {}
    if info.get("redelivered"):  # AMQP's flag; kombu's Redis and flowengine-fs set it too
        return True
    # kombu's in-memory transport marks a message it restores on the stored envelope only.
    raw = getattr(message, "_raw", None)
    return isinstance(raw, dict) and bool(raw.get("redelivered"))


def settle(message: Any, action: str) -> None:
    """Ack, requeue or reject ``message``, logging (not raising) if the channel refuses."""
    try:
        if action == "ack":
            message.ack()
        elif action == "requeue":
            message.requeue()
        else:
            message.reject(requeue=False)
    except Exception as err:  # the broker or channel may already be gone
        LOG.warning("Could not %s message %s: %s", action, describe(message), err)


class TypeDispatcher:
    """Dispatches messages to the handler registered for their ``type`` property.

    Args:
        type_handlers: Message type -> :class:`Handler`.
        requeue_filters: Callbacks; if any returns truthy, the message is requeued unprocessed
            (used to hand back messages that arrive while the consumer is stopping).
        max_body_bytes: Larger bodies are refused without decoding.
        max_depth: Bodies nesting deeper than this are refused.
        on_refused: Called as ``on_refused(message, reason, detail)`` after a message is
            refused (e.g. to tell the sender why); errors in it are logged, never raised.
        settles: Whether messages are settled here (acked, rejected, requeued); False for a
            consumer the broker settles for on delivery (no acknowledgements).
        check: Called with each message of a known type before it is decoded; a
            ``(reason, detail)`` answer refuses it, unlogged here (message authentication
            logs its own refusals, rate-limited).
    """

    def __init__(
        self,
        type_handlers: Mapping[str, Handler] | None = None,
        requeue_filters: Iterable[RequeueFilter] | None = None,
        max_body_bytes: int = pr.MAX_BODY_BYTES,
        max_depth: int = pr.MAX_NESTING_DEPTH,
        on_refused: Callable[[Any, str, str], None] | None = None,
        settles: bool = True,
        check: Callable[[Any], tuple[str, str] | None] | None = None,
    ) -> None:
        self._check = check
        self._on_refused = on_refused
        self._settles = settles
        self._type_handlers = dict(type_handlers or {})
        self._requeue_filters = list(requeue_filters or [])
        self._max_body_bytes = max_body_bytes
        self._max_depth = max_depth

    @property
    def type_handlers(self) -> dict[str, Handler]:
        """Message type -> handler."""
        return self._type_handlers

    @property
    def requeue_filters(self) -> list[RequeueFilter]:
        """The requeue filters, in call order."""
        return self._requeue_filters

    def on_decode_error(self, message: Any, error: Exception) -> None:
        """Kombu's hook for bodies it could not decode: refuse them, never raise."""
        self._refuse(message, REASON_DECODE_ERROR, str(error))

    def on_message(self, message: Any) -> None:
        """Check, decode, validate and dispatch one raw message. Never raises."""
        try:
            self._dispatch(message)
        except Exception as err:  # a bug here must not kill the consumer
            LOG.exception("Dispatching message %s failed", describe(message))
            self._refuse(message, REASON_HANDLER_ERROR, repr(err))

    def _dispatch(self, message: Any) -> None:
        message_type = (message.properties or {}).get("type")
        if message_type is None:
            return self._refuse(message, REASON_MISSING_TYPE, "no 'type' property")
        handler = self._type_handlers.get(message_type)
        if handler is None:
            return self._refuse(message, REASON_UNKNOWN_TYPE, f"no handler for {message_type!r}")
        refusal = self._check(message) if self._check is not None else None
        if refusal is not None:
            return self._refuse(message, *refusal, log=False)
        if message.content_type != JSON_CONTENT_TYPE:
            return self._refuse(message, REASON_CONTENT_TYPE, repr(message.content_type))
        size = len(message.body or b"")
        if size > self._max_body_bytes:
            return self._refuse(message, REASON_TOO_LARGE, f"{size} > {self._max_body_bytes} bytes")
        try:
            data = message.decode()
        except Exception as err:  # malformed JSON, bad encoding, recursion limit...
            return self._refuse(message, REASON_DECODE_ERROR, str(err))
        if pr.exceeds_depth(data, self._max_depth):
            return self._refuse(message, REASON_TOO_DEEP, f"nests deeper than {self._max_depth}")
        if self._settles and self._wants_requeue(data, message):
            LOG.debug("Requeuing message %s", describe(message))
            return settle(message, "requeue")
        if handler.validator is not None:
            try:
                handler.validator(data)
            except (exc.InvalidFormat, ValueError, TypeError, KeyError) as err:
                return self._refuse(message, REASON_INVALID_FORMAT, str(err))
        if self._settles and not handler.manual_ack:
            settle(message, "ack")
        try:
            handler.process_message(data, message)
        except Exception as err:
            LOG.exception("Handler for %s message %s raised", message_type, describe(message))
            if not message.acknowledged:
                self._refuse(message, REASON_HANDLER_ERROR, repr(err))

    def _wants_requeue(self, data: Any, message: Any) -> bool:
        votes = 0
        for requeue_filter in self._requeue_filters:
            try:
                votes += bool(requeue_filter(data, message))
            except Exception:
                LOG.exception("Requeue filter %r raised on %s", requeue_filter, describe(message))
        return votes > 0

    def _refuse(self, message: Any, reason: str, detail: str, log: bool = True) -> None:
        # One line per refused message; the detail is capped so a hostile body cannot flood logs.
        if log:
            LOG.warning(
                "Rejected message %s: reason=%s %s", describe(message), reason, detail[:200])
        if self._on_refused is not None:
            try:
                self._on_refused(message, reason, detail[:200])
            except Exception:
                LOG.exception("Refusal hook failed for message %s", describe(message))
        if self._settles and not message.acknowledged:
            settle(message, "reject")
