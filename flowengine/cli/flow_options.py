"""Options the flow commands share (``run``, ``conductor``, ``flows``, ``show``, ``graph``,
``check``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from flowengine.cli.broker import broker_options


def backend_option(required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add --backend (a persistence URI)."""
    return click.option(
        "--backend", "backend_uri", envvar="FLOWENGINE_BACKEND", required=required,
        help="Persistence URI: sqlite:///flows.db, postgresql://..., dir:///path.")


def engine_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --engine, the broker options and --topic: how a command runs flows (``run``,
    ``conductor``)."""
    command = click.option(
        "--topic", "topics", multiple=True, envvar="FLOWENGINE_TOPIC",
        help="Worker topic to ask for workers (worker-based engine). Repeatable.")(command)
    command = broker_options(command)
    return click.option(
        "--engine", "engine_name", envvar="FLOWENGINE_ENGINE", default="serial",
        show_default=True,
        help="serial, parallel, worker-based, or an engine URI such as "
             "parallel://?max_workers=4.")(command)
