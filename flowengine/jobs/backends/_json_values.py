"""JSON values as the ZooKeeper and etcd boards store them (UTF-8 bytes, objects only)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["decode", "encode"]


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
