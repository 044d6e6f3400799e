"""Text helpers shared by the flow commands: durations, short values, aligned columns, missing
inputs."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from flowengine import exceptions as exc

#: Width values are cut to unless ``--full`` is given.
VALUE_WIDTH = 60


def duration(seconds: float | None) -> str:
    """``0.42s``, ``3m05s``, ``1h02m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def percent(progress: float | None) -> str:
    """``50%``; ``-`` when unknown."""
    return "-" if progress is None else f"{progress:.0%}"


def truncate(text: str, width: int | None = VALUE_WIDTH) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis (None: never cut)."""
    text = " ".join(text.split())
    if width is None or len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…"


def to_json(value: Any, **kwargs: Any) -> str:
    """JSON text of ``value``; what JSON cannot hold is shown by its ``repr``."""
    return json.dumps(value, default=repr, **kwargs)


def short_value(value: Any, width: int | None = VALUE_WIDTH) -> str:
    """A stored result as short text (JSON for data, as it is stored)."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else to_json(value, sort_keys=True)
    return truncate(text, width)


def timestamp(epoch: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC (``2024-05-01T12:00:00.123Z``), or None."""
    if epoch is None:
        return None
    when = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as left-aligned columns two spaces apart, headers first (stable for pipes and tests)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    lines = []
    for row in (headers, *rows):
        cells = [cell.ljust(w) for cell, w in zip(row, widths)]
        lines.append("  ".join(cells).rstrip())
    return lines


def missing_inputs(flow_name: str, err: exc.MissingDependencies,
                   flow_id: str = "FLOW_ID") -> list[str]:
    """The inputs a flow needs, then which atom needs which: not the nested cause chain."""
    if isinstance(err, exc.MissingSecrets):
        wanted = list(err.missing_requirements)
        example = " ".join(f"--store {name}=VALUE" for name in wanted)
        return [f"error: flow {flow_name!r}: MissingSecrets: its secret input(s) "
                f"{', '.join(wanted)} were never stored; give them again",
                f"hint: flowengine run --resume {flow_id} {example}"]
    needs: dict[str, dict[str, list[str]]] = {}  # atom -> name -> methods
    cause: BaseException | None = err
    while isinstance(cause, exc.MissingDependencies):
        if cause.method is not None:
            atom = str(getattr(cause.who, "name", cause.who))
            for name in cause.missing_requirements:
                needs.setdefault(atom, {}).setdefault(name, []).insert(0, cause.method)
        cause = cause.cause
    wanted = sorted(err.missing_requirements)
    lines = [f"error: flow {flow_name!r}: MissingDependencies: it needs input(s) nothing in it "
             f"provides: {', '.join(wanted)}"]
    lines += [f"  {name}: needed by atom {atom!r} ({', '.join(methods)})"
              for atom, names in needs.items() for name, methods in names.items()]
    example = " ".join(f"--store {name}=VALUE" for name in wanted)
    lines.append(f"hint: give them with --store NAME=VALUE ({example})")
    return lines
