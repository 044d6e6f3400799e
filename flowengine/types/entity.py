"""An entity (a conductor, say) that registers itself on a jobboard; TaskFlow's type."""

from __future__ import annotations

from typing import Any

__all__ = ["Entity"]


class Entity:
    """Something with a kind, a unique name and JSON-ready metadata.

    Args:
        kind: What it is (``conductor``).
        name: Its unique name.
        metadata: What others may want to know of it (host, pid, engine, started_on...).
    """

    def __init__(self, kind: str, name: str, metadata: dict[str, Any] | None = None) -> None:
        self.kind = kind
        self.name = name
        self.metadata = dict(metadata or {})

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "name", "metadata"}``."""
        return {"kind": self.kind, "name": self.name, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entity:
        """Read :meth:`to_dict`'s form."""
        return cls(data["kind"], data["name"], data.get("metadata"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Entity) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.kind, self.name))

    def __repr__(self) -> str:
        return f"Entity(kind={self.kind!r}, name={self.name!r})"
