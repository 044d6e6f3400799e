"""How far a link decider's "do not run" reaches (``Depth``)."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Depth(str, enum.Enum):
    """Which atoms are ignored when a link's decider returns False.

    The target atom is always ignored; the depth says what else is. A str enum, as TaskFlow's
    is: ``Depth.ALL == "ALL"``, and ``str()`` and formatting give the bare value.
    """

    #: The target and everything reachable after it (the default).
    ALL = "ALL"
    #: The target and what follows it inside the same flow.
    FLOW = "FLOW"
    #: The target and its immediate successor tasks.
    NEIGHBORS = "NEIGHBORS"
    #: Only the target.
    ATOM = "ATOM"

    # enum.StrEnum (Python 3.11+) would give these; flowengine also runs on 3.10.
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]

    # TaskFlow's name, though it hides str.translate (as TaskFlow's Depth does).
    @classmethod
    def translate(cls, desired_depth: Depth | str) -> Depth:  # type: ignore[override]
        """Accept a Depth or its (case-insensitive) name; raise ValueError naming bad input."""
        if isinstance(desired_depth, cls):
            return desired_depth
        if not isinstance(desired_depth, str):
            raise TypeError(f"Unexpected desired depth type, string or Depth expected, not "
                            f"{type(desired_depth).__name__}")
        try:
            return cls(desired_depth.upper())
        except ValueError:
            pretty = ", ".join(d.value for d in cls)
            raise ValueError(
                f"Unexpected decider depth value {desired_depth!r}, expected one of [{pretty}]"
            ) from None


# Widest first: when several deciders say no, the widest reach wins.
_ORDERING = (Depth.ALL, Depth.FLOW, Depth.NEIGHBORS, Depth.ATOM)


def pick_widest(depths: Iterable[Depth]) -> Depth:
    """Return the widest of the given depths (ALL > FLOW > NEIGHBORS > ATOM)."""
    present = set(depths)
    for depth in _ORDERING:
        if depth in present:
            return depth
    raise ValueError("At least one depth must be given")
