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


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --json."""
    return click.option("--json", "as_json", is_flag=True, envvar="FLOWENGINE_JSON",
                        help="Print JSON instead of text.")(command)


def show_envvars(command: click.Command) -> click.Command:
    """List each option's environment variable in ``--help``."""
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar:
            param.show_envvar = True
    return command
