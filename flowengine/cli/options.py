"""Option parsing and declaration shared by the ``flowengine`` commands.

Every option of every command is also read from one environment variable, named after the
option: ``FLOWENGINE_`` and the long name in capitals, dashes as underscores (``--json``:
``FLOWENGINE_JSON``; ``--metrics-port``: ``FLOWENGINE_METRICS_PORT``), and ``--help`` shows it.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Callable, Iterable
from typing import Any

import click
from click.core import ParameterSource


def json_option(help_text: str = "JSON lines: one JSON object per line."
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add --json (passed as ``as_json``)."""
    return click.option("--json", "as_json", is_flag=True, envvar="FLOWENGINE_JSON",
                        help=help_text)


def show_envvars(command: click.Command) -> click.Command:
    """List each option's environment variable in ``--help`` (apply above ``@click.command``)."""
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar:
            param.show_envvar = True
    return command


def without_options(*names: str) -> Callable[[click.Command], click.Command]:
    """Remove parameters a shared decorator added that mean nothing to one command, so that
    it refuses them instead of ignoring them (apply above ``@click.command``)."""
    def remove(command: click.Command) -> click.Command:
        command.params = [p for p in command.params if p.name not in names]
        return command
    return remove


def parse_pairs(values: Iterable[str], what: str) -> dict[str, Any]:
    """Turn ``key=value`` strings into a dict; values are JSON when they parse as JSON.

    Raises:
        click.BadParameter: an item has no ``=``; the message names it.
    """
    found: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{what} {item!r} is not of the form key=value")
        try:
            found[key] = json.loads(raw)
        except ValueError:
            found[key] = raw
    return found


def split_env_list(values: tuple[str, ...]) -> list[str]:
    """Flatten repeatable options that may also come from an env var as ``a,b`` or ``a b``."""
    out: list[str] = []
    for value in values:
        out.extend(part for part in value.replace(",", " ").split() if part)
    return out


def split_from_env(ctx: click.Context, param: click.Parameter,
                   value: tuple[str, ...]) -> tuple[str, ...]:
    """Click callback of a repeatable option: values read from its environment variable are
    split on commas and whitespace; values given on the command line are kept whole."""
    if param.name and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT:
        return tuple(split_env_list(value))
    return value


def operator(command: str) -> str:
    """Who asks, for the records a command writes (a cancel, a repair): the user, the host and
    the command, e.g. ``alice@ops-1 (flowengine cancel)``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "?"
    return f"{user}@{socket.gethostname()} ({command})"
