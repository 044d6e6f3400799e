"""Which versions of its task classes a worker serves, on the wire and in the worker finder.

A task's ``version`` (``(1, 0)`` by default) travels in every request (``task_version``); its
major part is what must match: a worker runs a request only for the major version of the class
it has. A flowengine worker announces the version of each class it serves in a header of its
NOTIFY replies and announcements (TaskFlow's NOTIFY schema refuses unknown body fields, and
TaskFlow engines ignore headers), so an engine sends a request only while a worker serving its
major version is known, and during a rolling upgrade, where workers of two versions share a
topic's queue, a worker handed a request for another major version hands it back unrun for
the engine to send again (doc/coordination.rst).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["HEADER_TASK_VERSIONS", "decode", "encode", "major", "text"]

#: NOTIFY reply and announcement header: JSON ``{task class: "major.minor"}``.
HEADER_TASK_VERSIONS = "x-flowengine-task-versions"
#: Most classes read from one header (a bound on what a peer can make us keep).
MAX_CLASSES = 10_000


def major(version: Any) -> str:
    """The major part of a version given as "1.2" or as a list of numbers."""
    parts = version.split(".") if isinstance(version, str) else list(version or [])
    return str(parts[0]) if parts else ""


def text(version: Any) -> str:
    """A version as shown and announced: ``(2, 1)`` -> ``"2.1"``."""
    if isinstance(version, str):
        return version
    if isinstance(version, Iterable):
        return ".".join(str(part) for part in version)
    return str(version)


def encode(versions: Mapping[str, str]) -> str:
    """The header value announcing ``{task class: version}``."""
    return json.dumps(dict(sorted(versions.items())), separators=(",", ":"))


def decode(value: Any) -> dict[str, str]:
    """The ``{task class: version}`` a header value announces (``{}`` if absent or unreadable:
    such a worker is taken to serve whatever version it is sent, as a TaskFlow worker does)."""
    if not isinstance(value, str):
        return {}
    try:
        found = json.loads(value)
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in list(found.items())[:MAX_CLASSES]
            if isinstance(k, str) and isinstance(v, (str, int, float))}
