"""Options the flow commands share (``run``, ``flows``, ``show``, ``graph``, ``check``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def backend_option(required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add --backend (a persistence URI)."""
    return click.option(
        "--backend", "backend_uri", envvar="FLOWENGINE_BACKEND", required=required,
        help="Persistence URI: sqlite:///flows.db, postgresql://..., dir:///path.")
