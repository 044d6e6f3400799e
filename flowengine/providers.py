"""Which atoms (or injected values) provide each stored name, and which of them an atom sees.

Lookup order, as TaskFlow's: values injected into the flow (``storage.inject``) come first, then
the results of atoms the consumer can see (its ancestors in the compiled graph), closest first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Finds which of ``candidates`` (provider atom names) an atom can see, closest first.
ScopeFetcher = Callable[[str, list[str]], list[str]]
#: Reads one provider's value: ``(found, value)``.
ResultReader = Callable[["Provider"], tuple[bool, Any]]

#: The provider name of values injected with ``transient=True`` (kept in memory only).
TRANSIENT: Any = object()


def item_from(container: Any, index: Any) -> Any:
    """The part of a result a provider names: all of it (None), or one item or key."""
    if index is None:
        return container
    return container[index]


class Provider:
    """An atom (or injected values) that provides a name, at ``index`` of its result."""

    __slots__ = ("name", "index")

    def __init__(self, name: Any, index: Any) -> None:
        self.name = name
        self.index = index

    def __repr__(self) -> str:
        return f"<provider {self.name!r} index={self.index!r}>"


class ProviderIndex:
    """Maps stored names to their providers and resolves them for a consuming atom.

    Args:
        injector_name: the pseudo-atom holding persistent injected values.
        read: reads a provider's value.
    """

    def __init__(self, injector_name: str, read: ResultReader) -> None:
        self._injector = injector_name
        self._read = read
        self._by_name: dict[str, list[Provider]] = {}
        # name -> (injected providers, atom providers, atom names): read per argument of every
        # atom run, written only as providers are added.
        self._splits: dict[str, tuple[list[Provider], list[Provider], list[str]]] = {}
        self.scope_fetcher: ScopeFetcher | None = None

    def add(self, provider: Any, mapping: Mapping[str, Any]) -> None:
        """Record that ``provider`` provides each name of ``mapping`` at its index."""
        for name, index in mapping.items():
            self._splits.pop(name, None)
            entries = self._by_name.setdefault(name, [])
            if not any(p.name == provider and p.index == index for p in entries):
                if provider is TRANSIENT:
                    entries.insert(0, Provider(provider, index))
                else:
                    entries.append(Provider(provider, index))

    def names(self) -> list[str]:
        """Every name something provides."""
        return list(self._by_name)

    def fetch_values(self, name: str, read: ResultReader) -> list[Any]:
        """Every value of ``name`` as ``read`` finds them: injected values first, then atoms.

        ``read`` raises NotFound where the name cannot be fetched at all (TaskFlow's ``fetch``).
        """
        defaults, atoms, _names = self._split(name) if name in self._by_name else ([], [], [])
        found = (read(p) for p in defaults + atoms)
        return [value for ok, value in found if ok]

    def _split(self, name: str) -> tuple[list[Provider], list[Provider], list[str]]:
        split = self._splits.get(name)
        if split is None:
            providers = self._by_name.get(name, [])
            defaults = [p for p in providers if p.name is TRANSIENT or p.name == self._injector]
            atoms = [p for p in providers if p.name is not TRANSIENT and p.name != self._injector]
            split = self._splits[name] = (defaults, atoms, [p.name for p in atoms])
        return split

    def _visible(self, atom_name: str | None, atoms: list[Provider],
                 names: list[str]) -> list[Provider]:
        if atom_name is None or self.scope_fetcher is None or not atoms:
            return atoms
        seen = self.scope_fetcher(atom_name, names)
        if len(atoms) == 1:  # the usual case: one provider, seen or not
            return atoms if seen else []
        order = {n: i for i, n in enumerate(seen)}
        return sorted((p for p in atoms if p.name in order), key=lambda p: order[p.name])

    def lookup(self, atom_name: str | None, name: str) -> tuple[bool, Any, str]:
        """Resolve ``name`` for ``atom_name``: ``(found, value, why not)``."""
        if name not in self._by_name:
            return False, None, f"no atom or injected value provides {name!r}"
        defaults, atoms, names = self._split(name)
        visible = self._visible(atom_name, atoms, names)
        for provider in defaults + visible:
            found, value = self._read(provider)
            if found:
                return True, value, ""
        if not visible and not defaults:
            who = ", ".join(repr(p.name) for p in atoms)
            return False, None, f"{name!r} is provided by {who}, which {atom_name!r} cannot see"
        who = ", ".join(repr(p.name) for p in visible)
        return False, None, f"{name!r} was not produced by {who} (not run, ignored or failed)"

    def can_provide(self, atom_name: str, name: str) -> bool:
        """Whether anything ``atom_name`` can see could ever provide ``name``."""
        defaults, atoms, names = self._split(name)
        # Injected values count only while they are there (a saved injector may have lost one).
        if any(self._read(provider)[0] for provider in defaults):
            return True
        if not atoms or atom_name is None or self.scope_fetcher is None:
            return bool(atoms)
        return bool(self.scope_fetcher(atom_name, names))

    def unsatisfied(self, atom_name: str, mapping: Mapping[str, str],
                    injected: Mapping[str, Any], optional: Iterable[str]) -> set[str]:
        """Names of ``mapping`` that neither ``injected`` nor any visible provider supplies."""
        skip = set(optional)
        return {name for arg, name in mapping.items()
                if name not in injected and arg not in skip and name not in skip
                and not self.can_provide(atom_name, name)}
