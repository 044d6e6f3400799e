"""Programs compared in this session (``conftest`` reports how many)."""

from typing import Any

PROGRAMS: list[Any] = []


def append(program: Any) -> None:
    PROGRAMS.append(program)
