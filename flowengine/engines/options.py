"""Engine options: one typed, validated record instead of a loose dict."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


def as_bool(name: str, value: Any) -> bool:
    """Accept booleans and their usual string spellings (engine URIs carry strings).

    ``None`` is false, as TaskFlow reads it (``options.get(name, default)`` tested for truth):
    for ``defer_reverts`` and ``never_resolve`` that is their default, for ``inject_transient``
    it is not.
    """
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int):
        return bool(value)
    raise ValueError(f"Engine option {name!r} must be a boolean, got {value!r}")


def as_optional_int(name: str, value: Any, minimum: int = 1) -> int | None:
    """Accept None, ints and digit strings no smaller than ``minimum``."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"Engine option {name!r} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"Engine option {name!r} must be >= {minimum}, got {number}")
    return number


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Options every action engine understands; engine-specific ones stay in ``extra``.

    Attributes:
        defer_reverts: a retry's REVERT always defers to the enclosing retry controller.
        never_resolve: do not consult retry controllers; any failure stops the engine.
        inject_transient: atoms' ``inject`` values are kept in memory only (not stored).
        executor: the parallel engine's executor (an Executor, or "threads").
        max_workers: the parallel engine's thread count.
        extra: every other option, for engines that understand them.
    """

    defer_reverts: bool = False
    never_resolve: bool = False
    inject_transient: bool = True
    executor: Any = None
    max_workers: int | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> EngineOptions:
        """Validate a mapping of options (as given to ``engines.load``)."""
        options = dict(options or {})
        return cls(
            defer_reverts=as_bool("defer_reverts", options.pop("defer_reverts", False)),
            never_resolve=as_bool("never_resolve", options.pop("never_resolve", False)),
            inject_transient=as_bool("inject_transient", options.pop("inject_transient", True)),
            executor=options.pop("executor", None),
            max_workers=as_optional_int("max_workers", options.pop("max_workers", None)),
            extra=options,
        )

    def as_dict(self) -> dict[str, Any]:
        """The options as a plain dict (what ``engine.options`` returns)."""
        found = {f.name: getattr(self, f.name)
                 for f in dataclasses.fields(self) if f.name != "extra"}
        found.update(self.extra)
        return found
