"""What every persistence record shares: an immutable name and uuid, and how it is described."""

from __future__ import annotations

from typing import Any


class NamedRecord:
    """Base of logbooks, flow details and atom details: a name and a uuid fixed at creation.

    Args:
        name: The record's name.
        uuid: Its unique id.
    """

    def __init__(self, name: str, uuid: str) -> None:
        self._name = name
        self._uuid = uuid

    @property
    def uuid(self) -> str:
        """The record's unique id."""
        return self._uuid

    @property
    def name(self) -> str:
        """The record's name."""
        return self._name


def format_meta(meta: dict[str, Any] | None, indent: int) -> list[str]:
    """Return the lines describing ``meta`` (progress shown as a percentage, as TaskFlow does)."""
    if not meta:
        return []
    lines = [f"{' ' * indent}- metadata:"]
    for key, value in meta.items():
        if key == "progress" and isinstance(value, int | float) and not isinstance(value, bool):
            value = f"{value * 100.0:0.2f}%"
        lines.append(f"{' ' * (indent + 2)}+ {key} = {value}")
    return lines


def format_shared(obj: Any, indent: int) -> list[str]:
    """Return the ``uuid`` and ``state`` lines of a logbook, flow detail or atom detail."""
    return [
        f"{' ' * indent}- {name} = {getattr(obj, name)}"
        for name in ("uuid", "state")
        if hasattr(obj, name)
    ]


def version_string(version: Any) -> str | None:
    """Return an atom version (a tuple such as ``(1, 0)`` or a string) as text."""
    if isinstance(version, list | tuple):
        return ".".join(str(part) for part in version)
    return None if version is None else str(version)
