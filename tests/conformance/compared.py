"""What the conformance tests compared in this session (``conftest`` reports it)."""

from typing import Any

#: The generated programs compared with TaskFlow.
PROGRAMS: list[Any] = []
#: One line per TaskFlow unit test module: its pass count on flowengine and its floor.
UNIT_COUNTS: list[str] = []


def append(program: Any) -> None:
    PROGRAMS.append(program)
