"""Secret values: how a program marks them, and the one function that masks them everywhere.

A ``store`` value is marked secret by wrapping it::

    engines.load(flow, store={"user": "bob", "password": Secret(password)})

and a task's argument by naming it in the task's ``secret_args``. The engine hands tasks the
plain value, never writes it to persistence (a resumed flow is asked for it again), and masks
every text form it can take (plain, ``repr``/``!r`` escaped, JSON escaped, inside the ``str``
of a container, and those forms escaped once more) in stored results and failures, logs, events,
``flowengine show`` and the dashboard, with :class:`Masker`.

This module imports nothing from flowengine, so every layer can mask with it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

__all__ = ["MASK", "Masker", "Secret", "mask_text", "mask_value", "reveal", "secret_sources"]

#: What a secret is replaced by.
MASK = "***"


class Secret:
    """A value to keep secret: wrap a ``store`` value in it to mark it.

    Its ``str`` and ``repr`` never show the value; :meth:`reveal` does.

    Args:
        value: The secret (a string, number, or a container of them).
    """

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value.reveal() if isinstance(value, Secret) else value

    def reveal(self) -> Any:
        """The secret value itself."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK


def reveal(value: Any) -> Any:
    """``value`` itself, or the value a :class:`Secret` wraps."""
    return value.reveal() if isinstance(value, Secret) else value


class _Atom(Protocol):
    """What :func:`secret_sources` reads of an atom (this module imports no flowengine type)."""

    @property
    def secret_args(self) -> Iterable[str]: ...

    @property
    def rebind(self) -> Mapping[str, str]: ...


class _Flow(Protocol):
    """What :func:`secret_sources` reads of a flow: its children, atoms or flows."""

    def iter_nodes(self) -> Iterable[tuple[_Atom | _Flow, Mapping[str, Any]]]: ...


def secret_sources(flow: _Flow | _Atom) -> set[str]:
    """The stored names the atoms of ``flow`` (at any depth) read into their ``secret_args``."""
    names: set[str] = set()
    for atom in _atoms(flow):
        for arg in atom.secret_args:
            names.add(atom.rebind.get(arg, arg))
    return names


def _atoms(flow: _Flow | _Atom) -> Iterator[_Atom]:
    if not hasattr(flow, "iter_nodes"):
        yield flow
        return
    for node, _meta in flow.iter_nodes():
        yield from _atoms(node)


def _leaves(value: Any, depth: int = 0) -> Iterator[Any]:
    """The scalars of a secret value (a container's items are secrets each)."""
    value = reveal(value)
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, (str, bytes, int, float)):
        yield value
    elif depth < 8 and isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item, depth + 1)
    elif depth < 8 and isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _leaves(item, depth + 1)
    else:
        yield str(value)


#: How a character reads after a backslash, for those written as a letter (``\\n``).
_LETTER_ESCAPES = {"\n": "n", "\r": "r", "\t": "t", "\b": "b", "\f": "f", "\0": "0"}


def _char_pattern(char: str) -> str:
    """A regular expression for ``char`` as any ``repr``/JSON escaping, nested, writes it."""
    if char.isascii() and char.isalnum():
        return char  # never escaped
    code = ord(char)
    hexes = [f"u{code:04x}", f"U{code:08x}"] + ([f"x{code:02x}"] if code < 0x100 else [])
    if code > 0xFFFF:  # JSON writes it as a surrogate pair
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        hexes.append(f"u{high:04x}\\\\*u{low:04x}")
    forms = {re.escape(char), re.escape(_LETTER_ESCAPES.get(char, ""))}
    forms.update(hexes)
    forms.update(h[0] + h[1:].upper() for h in hexes)
    # Each level of escaping doubles the backslashes before a character: allow any number.
    return "\\\\*(?:" + "|".join(sorted(f for f in forms if f)) + ")"


def secret_patterns(value: Any) -> set[str]:
    """Regular expressions matching every text form of a secret value (one per leaf form).

    Matches the plain text and any nesting of ``repr`` and JSON escaping of it (a ``!r`` in
    an exception message stored as JSON and shown as a ``repr``, say): escaped characters
    may carry any number of backslashes, and non-ASCII ones may be ``\\uXXXX`` escapes.
    """
    return {"".join(_char_pattern(c) for c in text)
            for leaf in _leaves(value) for text in _texts(leaf)}


def _texts(leaf: Any) -> set[str]:
    if isinstance(leaf, bytes):
        return {t for t in (leaf.decode("utf-8", "replace"), repr(leaf)[2:-1]) if t}
    return {t for t in (leaf if isinstance(leaf, str) else repr(leaf), str(leaf)) if t}


class Masker:
    """Masks a growing set of secret values wherever they appear.

    Args:
        values: The first secret values (more are given to :meth:`add`).
    """

    def __init__(self, values: Iterable[Any] = ()) -> None:
        self._lock = threading.Lock()
        self._scalars: list[Any] = []
        self._patterns: set[str] = set()
        self._regex: re.Pattern[str] | None = None
        for value in values:
            self.add(value)

    def add(self, value: Any) -> bool:
        """Mask ``value`` (its leaves, when a container) from now on; True if it is new."""
        leaves = [leaf for leaf in _leaves(value) if leaf not in self._scalars and leaf != ""]
        if not leaves:
            return False
        with self._lock:
            self._scalars.extend(leaves)
            self._patterns |= secret_patterns(leaves)
            # Longest first, so a secret containing another is masked whole.
            ordered = sorted(self._patterns, key=len, reverse=True)
            self._regex = re.compile("|".join(ordered))
        return True

    def __bool__(self) -> bool:
        return self._regex is not None

    def found_in(self, text: str) -> bool:
        """Whether any form of a secret appears in ``text``."""
        return self._regex is not None and self._regex.search(text) is not None

    def text(self, text: str) -> str:
        """``text`` with every form of every secret replaced by ``***``."""
        return text if self._regex is None else self._regex.sub(MASK, text)

    def value(self, data: Any, depth: int = 0) -> Any:
        """A copy of ``data`` with secrets masked in every string and item (keys are kept).

        Numbers equal to a secret become ``***``; an object of another type whose ``repr``
        shows a secret becomes its masked ``repr``; anything else is returned as it is.
        """
        if self._regex is None or data is None or isinstance(data, bool):
            return data
        if isinstance(data, Secret):
            return MASK
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, (int, float, bytes)):
            return MASK if data in self._scalars else data
        if depth < 32 and isinstance(data, dict):
            return {k: self.value(v, depth + 1) for k, v in data.items()}
        if depth < 32 and isinstance(data, (list, tuple, set, frozenset)):
            items = [self.value(item, depth + 1) for item in data]
            if isinstance(data, list):
                return items
            # A named tuple takes its items as arguments.
            return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
        try:
            shown = repr(data)
        except Exception:
            return data
        return self.text(shown) if self.found_in(shown) else data


def mask_text(text: str, secrets: Iterable[Any]) -> str:
    """``text`` with every form of each of ``secrets`` replaced by ``***``."""
    return Masker(secrets).text(text)


def mask_value(data: Any, secrets: Iterable[Any]) -> Any:
    """A copy of ``data`` with every form of each of ``secrets`` masked (:meth:`Masker.value`)."""
    return Masker(secrets).value(data)
