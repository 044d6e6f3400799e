"""JSON values as the boards store them (UTF-8 bytes, objects only), and new job postings."""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import TYPE_CHECKING, Any

from flowengine.jobs import base

if TYPE_CHECKING:
    from flowengine.persistence import models

__all__ = ["decode", "encode", "new_posting"]


def encode(data: Any) -> bytes:
    """Compact JSON bytes for a stored value."""
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def decode(raw: bytes | None) -> dict[str, Any]:
    """A stored value's JSON object ({} if empty, not JSON or not an object)."""
    if not raw:
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def new_posting(name: str, book: models.LogBook | None, details: dict[str, Any] | None,
                priority: base.JobPriority | str,
                dated: bool = True) -> tuple[dict[str, Any], bytes]:
    """A new job's posting (fresh uuid; created now, unless not ``dated``: a service that
    stamps its records itself) and its encoded value.

    Raises:
        ValueError: If the details are not JSON-ready (the message names the job).
    """
    now = base.utcnow() if dated else None
    posting = base.format_posting(str(uuidlib.uuid4()), name, created_on=now, last_modified=now,
                                  details=details, book=book,
                                  priority=base.JobPriority.convert(priority))
    try:
        return posting, encode(posting)
    except (TypeError, ValueError) as err:
        raise ValueError(f"Details of job '{name}' are not JSON-ready: {err}") from err
