"""The codec: what flowengine messages look like as bytes on the wire (JSON, bounded)."""

from __future__ import annotations

from kombu import serialization

from flowengine.worker_based import protocol as pr


class MessageEncodeError(ValueError):
    """A message body is not JSON-serializable, or is larger than the receive bound."""


def encode(msg: pr.Message) -> bytes:
    """Serialize ``msg`` as the JSON body that goes on the wire.

    Raises:
        MessageEncodeError: Not JSON-serializable, or over :data:`protocol.MAX_BODY_BYTES`.
    """
    try:
        _, _, data = serialization.dumps(msg.to_dict(), serializer="json")
    except Exception as err:  # kombu wraps the encoder's TypeError/ValueError
        raise MessageEncodeError(f"{msg.TYPE} body is not JSON-serializable: {err}") from err
    body = data.encode("utf-8") if isinstance(data, str) else data
    if len(body) > pr.MAX_BODY_BYTES:
        raise MessageEncodeError(
            f"{msg.TYPE} body is {len(body)} bytes, over the {pr.MAX_BODY_BYTES} byte bound"
        )
    return body
