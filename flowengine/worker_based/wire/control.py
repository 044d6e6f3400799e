"""The shape flowengine's control messages share (CANCEL, PAUSE, SUSPEND).

Each is a small JSON body with one schema. The validator is built once per message class, as
for the base protocol's messages (TaskFlow rebuilds one per message, which costs more than the
rest of handling it), and a body it refuses raises ``InvalidFormat`` naming the message type.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jsonschema
from jsonschema import exceptions as schema_exc

from flowengine import exceptions as exc
from flowengine.worker_based import protocol as pr

__all__ = ["ControlMessage"]


class ControlMessage(pr.Message):
    """A control message whose body ``SCHEMA`` describes (subclasses set ``TYPE`` and it)."""

    SCHEMA: ClassVar[dict[str, Any]]
    _validator: ClassVar[jsonschema.Draft202012Validator]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "SCHEMA" in cls.__dict__:
            cls._validator = jsonschema.Draft202012Validator(cls.SCHEMA)

    @classmethod
    def validate(cls, data: Any) -> None:
        """Raise InvalidFormat unless ``data`` is a body of this message type."""
        try:
            cls._validator.validate(data)
        except schema_exc.ValidationError as err:
            raise exc.InvalidFormat(f"{cls.TYPE.capitalize()} message data not of the expected "
                                    f"format: {err.message}", err) from err
