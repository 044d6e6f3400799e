"""The codec: what flowengine messages look like as bytes on the wire (JSON, bounded)."""

from __future__ import annotations

from kombu import serialization

from flowengine.worker_based import protocol as pr


class MessageEncodeError(ValueError):
    """A message body is not JSON-serializable, or exceeds a bound receivers apply (its size
    or its nesting)."""


def encode(msg: pr.Message) -> bytes:
    """Serialize ``msg`` as the JSON body that goes on the wire.

    The receive bounds are checked here as well, so that what a receiver would refuse unread
    is never sent: the sender can still say why (a worker sends a FAILURE naming the bound).

    Raises:
        MessageEncodeError: Not JSON-serializable, nested deeper than
            :data:`protocol.MAX_NESTING_DEPTH`, or over :data:`protocol.MAX_BODY_BYTES`.
    """
    body_dict = msg.to_dict()
    if pr.exceeds_depth(body_dict):
        raise MessageEncodeError(
            f"{msg.TYPE} body nests deeper than {pr.MAX_NESTING_DEPTH} levels, the bound "
            f"receivers apply (lists and objects within each other)")
    try:
        _, _, data = serialization.dumps(body_dict, serializer="json")
    except Exception as err:  # kombu wraps the encoder's TypeError/ValueError
        raise MessageEncodeError(f"{msg.TYPE} body is not JSON-serializable: {err}") from err
    body = data.encode("utf-8") if isinstance(data, str) else data
    if len(body) > pr.MAX_BODY_BYTES:
        raise MessageEncodeError(
            f"{msg.TYPE} body is {len(body)} bytes, over the {pr.MAX_BODY_BYTES} byte bound"
        )
    return body
