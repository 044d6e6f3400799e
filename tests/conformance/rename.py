"""Rename a TaskFlow program's imports to flowengine's, as a user migrating does.

The renames are the ones ``doc/migration.rst`` lists: ``taskflow.patterns`` becomes
``flowengine.flows``, ``taskflow.engines.action_engine.engine`` becomes ``flowengine.engines``,
``taskflow.engines.worker_based`` becomes ``flowengine.worker_based`` and any other
``taskflow.X`` becomes ``flowengine.X``. A TaskFlow module flowengine does not provide (TaskFlow's
internals such as ``taskflow.utils.misc``) keeps its ``taskflow`` name, so a program that leans on
one still imports and is judged on what it does with the public modules.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re

#: Prefix renames, most specific first.
PREFIXES = (
    ("taskflow.engines.action_engine.engine", "flowengine.engines"),
    ("taskflow.engines.worker_based", "flowengine.worker_based"),
    ("taskflow.patterns", "flowengine.flows"),
    ("taskflow", "flowengine"),
)

_FROM_IMPORT = re.compile(r"^(\s*from\s+)(taskflow(?:\.\w+)*)(\s+import\s+)(\([^)]*\)|[^\n#]+)",
                          re.MULTILINE)
_DOTTED = re.compile(r"(?<![\w.])taskflow(?:\.\w+)+")
_EITHER = re.compile(f"{_FROM_IMPORT.pattern}|{_DOTTED.pattern}", re.MULTILINE)
_PLAIN_IMPORT = re.compile(r"^(\s*import\s+)taskflow(\s|$)", re.MULTILINE)


def renamed_module(name: str) -> str:
    """The flowengine module a TaskFlow module name becomes (the name itself when none)."""
    for old, new in PREFIXES:
        if name == old or name.startswith(old + "."):
            candidate = new + name[len(old):]
            return candidate if _exists(candidate) else name
    return name


@functools.cache
def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


@functools.cache
def _has(module: str, attribute: str) -> bool:
    if _exists(f"{module}.{attribute}"):
        return True
    try:
        return hasattr(importlib.import_module(module), attribute)
    except ImportError:
        return False


def _from_import(match: re.Match[str]) -> str:
    head, module, middle, names = match.groups()[:4]
    target = renamed_module(module)
    imported = [part.split()[0] for part in names.strip().strip("()").split(",") if part.strip()]
    if len(imported) == 1:
        # ``from taskflow.engines.action_engine import engine as eng``: the module itself moves.
        whole = f"{module}.{imported[0]}"
        moved = renamed_module(whole)
        if moved != whole and moved != renamed_module(module) + f".{imported[0]}":
            alias = names.split()[-1] if " as " in f" {names} " else imported[0]
            parent, _, leaf = moved.rpartition(".")
            return f"{head}{parent}{middle}{leaf} as {alias}"
    if target == module or not all(_has(target, name) for name in imported):
        return match.group(0)
    return f"{head}{target}{middle}{names}"


def _dotted(match: re.Match[str]) -> str:
    """``taskflow.a.b.c`` (a module path, maybe followed by attributes)."""
    parts = match.group(0).split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if _exists(module):
            target = renamed_module(module)
            return ".".join([target, *parts[cut:]])
    return match.group(0)


def rename_source(source: str, extra: tuple[tuple[str, str], ...] = ()) -> str:
    """``source`` with its TaskFlow imports renamed; ``extra`` renames module prefixes first."""
    for old, new in extra:
        source = re.sub(rf"(?<![\w.]){re.escape(old)}(?=[\s.,)]|$)", new, source,
                        flags=re.MULTILINE)
    source = _PLAIN_IMPORT.sub(r"\1flowengine\2", source)
    # One pass, so a ``from`` line kept as it is is not renamed by the dotted rule after.
    return _EITHER.sub(lambda m: _from_import(m) if m.group(1) is not None else _dotted(m),
                       source)
