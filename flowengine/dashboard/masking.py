"""Keeping secrets off the pages: values shown are masked before any template sees them.

A value is masked when its key looks like a secret (``password``, ``token``...), when it is one
of an atom's ``secret_args``, or when it is a URL with a password in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from flowengine.persistence.backends._uri import mask_urls

MASK = "***"
#: Keys whose values are never shown.
SECRET_KEY = re.compile(r"pass(word|wd|phrase)?|secret|token|api[_-]?key|private[_-]?key|"
                        r"credential|auth", re.IGNORECASE)
#: Deepest nesting shown; deeper values are summarised by their type.
MAX_DEPTH = 6
#: Longest text shown.
MAX_TEXT = 4000


def mask(value: Any, secret_values: Iterable[str] = (), depth: int = 0) -> Any:
    """``value`` as JSON-able data with secrets replaced by ``***``.

    Args:
        value: What to show (results, stored arguments, metadata).
        secret_values: Exact string values to mask wherever they appear.
        depth: Nesting so far (callers leave it).
    """
    secrets = tuple(sorted({s for s in secret_values if s}, key=len, reverse=True))
    return _mask(value, secrets, depth)


def _mask(value: Any, secrets: tuple[str, ...], depth: int) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return mask_text(value, secrets)
    if depth >= MAX_DEPTH:
        return f"<{type(value).__name__}>"
    if isinstance(value, dict):
        return {str(k): MASK if SECRET_KEY.search(str(k)) else _mask(v, secrets, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_mask(item, secrets, depth + 1) for item in list(value)[:200]]
    return mask_text(f"<{type(value).__name__}>", secrets)


def mask_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL passwords and each of ``secrets`` masked, and shortened."""
    if "://" in text:
        text = mask_urls(text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"
