"""Route incoming messages by their ``type`` property, refusing anything malformed.

The dispatcher runs on the consumer thread and receives kombu messages *undecoded*, so that it can
refuse an oversized or wrongly typed body before parsing it. Every refusal is one log line with a
stable ``reason=`` code an operator can grep and count; no message can stop the consumer. What it
hands on (to handlers, requeue filters, checks and refusal hooks) is a
:class:`~flowengine.worker_based.broker.delivery.Delivery`, never the kombu message.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from flowengine import exceptions as exc
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import delivery as dv
from flowengine.worker_based.broker.delivery import Delivery

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

#: Gets (decoded body, delivery).
MessageCallback = Callable[[Any, Delivery], None]
#: Gets (data, delivery); a truthy answer requeues the message instead of processing it.
RequeueFilter = Callable[[Any, Delivery], Any]


class Handler(NamedTuple):
    """What to do with one message type.

    Attributes:
        process_message: Called with ``(data, delivery)`` once the body is valid (``data`` is
            ``delivery.body``).
        validator: Called with the body first; raises InvalidFormat to refuse it.
        manual_ack: If True, ``process_message`` settles the message itself (acks it once its
            outcome is published); otherwise the dispatcher acks it before processing.
    """

    process_message: MessageCallback
    validator: Callable[[Any], None] | None = None
    manual_ack: bool = False


def describe(message: Any) -> str:
    """A short, body-free description of ``message`` (or a delivery) for log lines."""
    if isinstance(message, Delivery):
        return message.describe()
    props = getattr(message, "properties", None) or {}
    info = getattr(message, "delivery_info", None) or {}
    return (
        f"(type={props.get('type')!r} correlation_id={props.get('correlation_id')!r}"
        f" routing_key={info.get('routing_key')!r} tag={getattr(message, 'delivery_tag', None)})"
    )


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
        on_refused: Called as ``on_refused(delivery, reason, detail)`` after a message is
            refused (e.g. to tell the sender why); errors in it are logged, never raised. A
            body refused as too deep was decoded: its delivery carries it (read its top level
            only).
        settles: Whether messages are settled here (acked, rejected, requeued); False for a
            consumer the broker settles for on delivery (no acknowledgements).
        check: Called with the delivery of each message of a known type before it is
            decoded; a ``(reason, detail)`` answer refuses it, unlogged here (message
            authentication logs its own refusals, rate-limited).
        settler: How handlers' :meth:`Delivery.ack` and friends settle (a consumer that
            settles on its own thread routes them there); default: at once.
        on_requeue: Called with the delivery of a message a requeue filter gives back, before
            it goes back (errors are logged, never raised).
    """

    def __init__(
        self,
        type_handlers: Mapping[str, Handler] | None = None,
        requeue_filters: Iterable[RequeueFilter] | None = None,
        max_body_bytes: int = pr.MAX_BODY_BYTES,
        max_depth: int = pr.MAX_NESTING_DEPTH,
        on_refused: Callable[[Delivery, str, str], None] | None = None,
        settles: bool = True,
        check: Callable[[Delivery], tuple[str, str] | None] | None = None,
        settler: dv.Settler = settle,
        on_requeue: Callable[[Delivery], None] | None = None,
    ) -> None:
        self._settler = settler
        self._on_requeue = on_requeue
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
        self._refuse(self._delivery(message), REASON_DECODE_ERROR, str(error))

    def on_message(self, message: Any) -> None:
        """Check, decode, validate and dispatch one raw message. Never raises."""
        delivery = self._delivery(message)
        try:
            self._dispatch(message, delivery)
        except Exception as err:  # a bug here must not kill the consumer
            LOG.exception("Dispatching message %s failed", delivery.describe())
            self._refuse(delivery, REASON_HANDLER_ERROR, repr(err))

    def _delivery(self, message: Any) -> Delivery:
        return dv.of(message, self._settler)

    def _dispatch(self, message: Any, delivery: Delivery) -> None:
        message_type = delivery.type
        if message_type is None:
            return self._refuse(delivery, REASON_MISSING_TYPE, "no 'type' property")
        handler = self._type_handlers.get(message_type)
        if handler is None:
            return self._refuse(delivery, REASON_UNKNOWN_TYPE, f"no handler for {message_type!r}")
        refusal = self._check(delivery) if self._check is not None else None
        if refusal is not None:
            return self._refuse(delivery, *refusal, log=False)
        if message.content_type != JSON_CONTENT_TYPE:
            return self._refuse(delivery, REASON_CONTENT_TYPE, repr(message.content_type))
        size = len(message.body or b"")
        if size > self._max_body_bytes:
            return self._refuse(delivery, REASON_TOO_LARGE,
                                f"{size} > {self._max_body_bytes} bytes")
        try:
            data = message.decode()
        except Exception as err:  # malformed JSON, bad encoding, recursion limit...
            return self._refuse(delivery, REASON_DECODE_ERROR, str(err))
        if pr.exceeds_depth(data, self._max_depth):
            return self._refuse(dataclasses.replace(delivery, body=data), REASON_TOO_DEEP,
                                f"nests deeper than {self._max_depth} levels")
        delivery = dataclasses.replace(delivery, body=data)
        if self._settles and self._wants_requeue(data, delivery):
            LOG.debug("Requeuing message %s", delivery.describe())
            if self._on_requeue is not None:
                try:
                    self._on_requeue(delivery)
                except Exception:
                    LOG.exception("Requeue hook failed for message %s", delivery.describe())
            return settle(message, "requeue")
        if handler.validator is not None:
            try:
                handler.validator(data)
            except (exc.InvalidFormat, ValueError, TypeError, KeyError) as err:
                return self._refuse(delivery, REASON_INVALID_FORMAT, str(err))
        if self._settles and not handler.manual_ack:
            settle(message, "ack")
        try:
            handler.process_message(data, delivery)
        except Exception as err:
            LOG.exception("Handler for %s message %s raised", message_type, delivery.describe())
            if not message.acknowledged:
                self._refuse(delivery, REASON_HANDLER_ERROR, repr(err))

    def _wants_requeue(self, data: Any, delivery: Delivery) -> bool:
        votes = 0
        for requeue_filter in self._requeue_filters:
            try:
                votes += bool(requeue_filter(data, delivery))
            except Exception:
                LOG.exception("Requeue filter %r raised on %s", requeue_filter,
                              delivery.describe())
        return votes > 0

    def _refuse(self, delivery: Delivery, reason: str, detail: str, log: bool = True) -> None:
        # One line per refused message; the detail is capped so a hostile body cannot flood logs.
        if log:
            LOG.warning(
                "Rejected message %s: reason=%s %s", delivery.describe(), reason, detail[:200])
        if self._on_refused is not None:
            try:
                self._on_refused(delivery, reason, detail[:200])
            except Exception:
                LOG.exception("Refusal hook failed for message %s", delivery.describe())
        message = dv.message_of(delivery)
        if self._settles and not message.acknowledged:
            settle(message, "reject")
