"""Keeping secrets off the pages: values shown are masked before any template sees them.

A value is masked when its key looks like a secret (``password``, ``token``...), when it is one
of an atom's ``secret_args``, or when it is a URL with a password in it. Secret values are
masked in every form (escaped, ``repr``, JSON) by :class:`flowengine.secrets.Masker`, the
function the engine, its logs and persistence use too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from flowengine.persistence.backends._uri import mask_urls
from flowengine.secrets import MASK, Masker

__all__ = ["MASK", "MAX_DEPTH", "MAX_TEXT", "SECRET_KEY", "mask", "mask_text"]
#: Keys whose values are never shown.
SECRET_KEY = re.compile(r"pass(word|wd|phrase)?|secret|token|api[_-]?key|private[_-]?key|"
                        r"credential|auth", re.IGNORECASE)
#: Deepest nesting shown; deeper values are summarised by their type.
MAX_DEPTH = 6
#: Longest text shown.
MAX_TEXT = 4000


def mask(value: Any, secret_values: Iterable[Any] = (), depth: int = 0) -> Any:
    """``value`` as JSON-able data with secrets replaced by ``***``.

    Args:
        value: What to show (results, stored arguments, metadata).
        secret_values: Secret values to mask wherever (and in whatever form) they appear.
        depth: Nesting so far (callers leave it).
    """
    return _mask(value, Masker(secret_values), depth)


def _mask(value: Any, secrets: Masker, depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return secrets.value(value)
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


def mask_text(text: str, secrets: Iterable[Any] | Masker = ()) -> str:
    """``text`` with URL passwords and each of ``secrets`` masked, and shortened."""
    if "://" in text:
        text = mask_urls(text)
    text = (secrets if isinstance(secrets, Masker) else Masker(secrets)).text(text)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"
