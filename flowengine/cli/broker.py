"""Broker options shared by the commands that talk to workers and queues."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from flowengine.cli.options import parse_pairs, split_from_env


def broker_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --url, --exchange, --transport, --transport-option (each from an env var too)."""
    decorators = [
        click.option("--url", envvar="FLOWENGINE_URL", default=None,
                     help="Broker URL (default: the embedded filesystem transport)."),
        click.option("--exchange", envvar="FLOWENGINE_EXCHANGE", default="default",
                     show_default=True, help="Exchange engines and workers use."),
        click.option("--transport", envvar="FLOWENGINE_TRANSPORT", default=None,
                     help="Kombu transport name (memory, redis, flowengine-fs, ...)."),
        click.option("--transport-option", "transport_options",
                     envvar="FLOWENGINE_TRANSPORT_OPTION", multiple=True,
                     callback=split_from_env,
                     help="Transport option key=value (a JSON value or a string). Repeatable; "
                          "the environment variable holds several, separated by commas or "
                          "whitespace."),
        click.option("--taskflow-compat", envvar="FLOWENGINE_TASKFLOW_COMPAT", is_flag=True,
                     help="Queues declared exactly as TaskFlow does (mixed fleets)."),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def broker_kwargs(url: str | None, exchange: str, transport: str | None,
                  transport_options: tuple[str, ...], taskflow_compat: bool) -> dict[str, Any]:
    """The keyword arguments the worker-based classes take, from the parsed options."""
    return {
        "exchange": exchange,
        "url": url,
        "transport": transport,
        "transport_options": parse_pairs(transport_options, "transport option"),
        "taskflow_compat": taskflow_compat,
    }
