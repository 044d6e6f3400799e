"""Configurations given as a URI or a dict, and backend classes found by name.

Persistence backends and jobboards are both configured TaskFlow's way: a URI string, or a dict
whose one key (``connection`` for persistence, ``board`` for jobboards) holds a URI or a bare
backend name, beside other options. Both then load the backend class from a table of built-in
names or from an entry point group. This module holds that shared shape; each caller supplies
how its URIs become options.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc

__all__ = ["load_class", "split_conf"]

#: Reads ``scheme://...`` into the backend name and the options the URI carries.
UriReader = Callable[[str], tuple[str, dict[str, Any]]]


def split_conf(
    conf: str | dict[str, Any], key: str, what: str, read_uri: UriReader
) -> tuple[str, dict[str, Any]]:
    """Return the backend name and a copy of the options of a URI or configuration dict.

    Options read from the URI (by ``read_uri``) never override keys the dict sets. A bare name,
    or TaskFlow's ``memory:`` spelling of one, is lower-cased and returned as it is.

    Args:
        conf: A URI or bare name, or a dict holding one under ``key``.
        key: The dict key that holds the URI (``connection``, ``board``).
        what: What is configured, for error messages (``Persistence``, ``Jobboard``).
        read_uri: Turns a ``scheme://`` URI into the backend name and its options.

    Raises:
        TypeError: If ``conf`` is neither a string nor a dict.
        ValueError: If the dict has no non-empty string under ``key``.
    """
    if isinstance(conf, str):
        conf = {key: conf}
    elif not isinstance(conf, dict):
        raise TypeError(f"{what} configuration must be a URI or a dict, not {type(conf)}")
    target = conf.get(key)
    if not isinstance(target, str) or not target:
        raise ValueError(f"{what} configuration needs a '{key}' (a URI or backend name)")
    options = dict(conf)
    if "://" not in target:
        return target.split(":", 1)[0].lower(), options
    name, from_uri = read_uri(target)
    for option, value in from_uri.items():
        options.setdefault(option, value)
    return name, options


def load_class(
    name: str,
    namespace: str,
    builtin: Mapping[str, str],
    default_namespace: str,
    what: str,
    where: str = "",
) -> type[Any]:
    """Import the backend class registered as ``name``.

    Built-in names (``module:Class`` targets in ``builtin``) are used only when ``namespace`` is
    the default one, as TaskFlow does; any other name is an entry point in ``namespace``.

    Args:
        name: The backend's registered name (a URI scheme, a board type).
        namespace: The entry point group to search.
        builtin: Built-in names and their ``module:Class`` targets.
        default_namespace: The group in which the built-in names apply.
        what: How the error names what was looked up (``jobboard backend named``).
        where: Context appended to the name in the error (the masked URI).

    Raises:
        flowengine.exceptions.NotFound: If nothing is registered as ``name`` (the message lists
            the known names and the entry point group).
    """
    target = builtin.get(name) if namespace == default_namespace else None
    if target is None:
        from importlib import metadata  # only for names outside the built-in table

        found = [ep for ep in metadata.entry_points(group=namespace) if ep.name == name]
        if not found:
            raise exc.NotFound(
                f"No {what} '{name}'{where}; known: {', '.join(sorted(builtin))},"
                f" or an entry point in group '{namespace}'"
            )
        loaded: type[Any] = found[0].load()
        return loaded
    module_name, _, class_name = target.partition(":")
    cls: type[Any] = getattr(importlib.import_module(module_name), class_name)
    return cls
