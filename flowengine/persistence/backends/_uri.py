"""Reading persistence URIs and options, and keeping passwords out of messages."""

from __future__ import annotations

import urllib.parse
from typing import Any

from flowengine.utils import backend_conf

# Schemes whose URI path is a filesystem path (file:///abs/path, dir:///abs/path).
_PATH_SCHEMES = ("dir", "file")


def mask_urls(text: str) -> str:
    """Replace the password of every ``scheme://user:password@host`` URL in ``text`` by ``***``."""
    parts = text.split("://")
    for i in range(1, len(parts)):
        head, sep, tail = parts[i].partition("@")
        if sep and ":" in head and "/" not in head:
            parts[i] = head.split(":", 1)[0] + ":***@" + tail
    return "://".join(parts)


def _read_uri(connection: str) -> tuple[str, dict[str, Any]]:
    parts = urllib.parse.urlsplit(connection)
    scheme = parts.scheme.lower().split("+", 1)[0]
    options: dict[str, Any] = dict(urllib.parse.parse_qsl(parts.query))
    if scheme in _PATH_SCHEMES:
        # dir://relative/path keeps its first segment in the host part of the URI.
        path = urllib.parse.unquote(parts.netloc + parts.path)
        if path:
            options["path"] = path
    return scheme, options


def split_conf(conf: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Return the backend scheme and the configuration dict of a URI or configuration dict.

    The URI's query parameters (and, for ``dir``/``file``, its path as ``path``) are merged into
    a copy of the dict without overriding keys it sets. A ``+dialect`` suffix is dropped from the
    returned scheme; TaskFlow's ``memory:`` / ``dir:`` spelling of a bare name is accepted.

    Raises:
        TypeError: If ``conf`` is neither a string nor a dict.
        ValueError: If there is no ``connection``.
    """
    return backend_conf.split_conf(conf, "connection", "Persistence", _read_uri)


def seconds_option(conf: dict[str, Any], key: str, default: float, owner: str) -> float:
    """Read a duration option (a number, or its text from a URI query) of ``owner``'s backend.

    Raises:
        ValueError: If it is not a number of seconds >= 0 (the message names owner and key).
    """
    value = conf.get(key, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds >= 0:  # also refuses NaN
        raise ValueError(f"{owner} option '{key}' must be seconds >= 0, not {value!r}")
    return seconds
