"""Option parsing shared by the ``flowengine`` commands."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import click


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
