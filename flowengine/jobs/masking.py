"""Showing job details without their secrets (CLI, logs, notifications, ``str(job)``)."""

from __future__ import annotations

import re
from typing import Any

from flowengine.persistence.backends._uri import mask_urls
from flowengine.secrets import MASK, Masker

__all__ = ["MASK", "is_secret_key", "masked", "scrub"]


# Key names whose values are secrets wherever they appear in details (store entries included).
_SECRET_KEY = re.compile(r"passw(or)?d|passphrase|secret|token|api[_-]?key|credential"
                         r"|private[_-]?key|authorization", re.IGNORECASE)


def is_secret_key(key: object) -> bool:
    """Whether a details key names a secret (``password``, ``db_token``, ``api_key``...)."""
    return isinstance(key, str) and _SECRET_KEY.search(key) is not None


def masked(data: Any) -> Any:
    """A copy of ``data`` with secret-named keys' values as ``***`` and URL passwords masked.

    Works at any depth of dicts, lists and tuples; other values are returned as they are.
    """
    if isinstance(data, dict):
        return {k: MASK if is_secret_key(k) else masked(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(masked(item) for item in data)
    if isinstance(data, str):
        return mask_urls(data)
    return data


def _secret_values(data: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if is_secret_key(key) and isinstance(value, (str, int, float)) and str(value):
                found.add(str(value))
            else:
                found |= _secret_values(value)
    elif isinstance(data, (list, tuple)):
        for item in data:
            found |= _secret_values(item)
    return found


def scrub(text: str, details: Any) -> str:
    """``text`` with every secret value of ``details`` (see :func:`masked`) and every URL
    password replaced by ``***`` (for messages that may quote a secret, such as errors)."""
    return mask_urls(Masker(_secret_values(details)).text(text))
