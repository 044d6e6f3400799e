"""Bounds applied on receipt, before anything else reads a message.

A body over :data:`MAX_BODY_BYTES` is refused undecoded, one nesting deeper than
:data:`MAX_NESTING_DEPTH` once decoded. These names are part of
:mod:`~flowengine.worker_based.protocol`, which re-exports them.
"""

from __future__ import annotations

from typing import Any

# Bounds applied on receipt, before anything else reads a message.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_NESTING_DEPTH = 64


def exceeds_depth(value: Any, limit: int = MAX_NESTING_DEPTH) -> bool:
    """Tell whether JSON-like ``value`` nests dicts/lists deeper than ``limit`` levels."""
    # Iterative on purpose: a hostile document must not cost us a RecursionError.
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False
