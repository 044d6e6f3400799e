"""What one flow holds secret, and the masked copies of its records that are written.

:class:`~flowengine.storage.Storage` keeps one :class:`SecretKeeper`: it learns which names and
values are secret (``Secret`` store values, atoms' ``secret_args``, what atoms provide under a
secret name) and turns each record about to be written into a copy with every secret masked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from flowengine.persistence import models
from flowengine.secrets import Masker, Secret, reveal
from flowengine.types.failure import Failure

if TYPE_CHECKING:
    from flowengine.atom import Atom

__all__ = ["META_SECRETS", "SecretKeeper"]

#: Flow meta key naming the stored values that are secret (their values are never stored).
META_SECRETS = "secret_inputs"
# The fields of an atom detail's dict that hold values (the others are its identity and state).
_VALUE_FIELDS = ("results", "revert_results", "meta", "failure", "revert_failure")


class SecretKeeper:
    """One flow's secrets: their names, the atoms' secret arguments, and the masker.

    Args:
        names: The names the flow's record lists as secret (given again on resume).
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.masker = Masker()
        self.names: set[str] = set(names)
        self.sources: set[str] = set()
        self._args: dict[str, tuple[str, ...]] = {}

    def note_atom(self, atom: Atom) -> None:
        """Remember ``atom``'s ``secret_args``."""
        secret_args = tuple(atom.secret_args)
        if secret_args:
            self._args[atom.name] = secret_args

    def split(self, pairs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(secret, plain)`` of store values; secret ones revealed and masked from now on."""
        secret = {k: reveal(v) for k, v in pairs.items()
                  if isinstance(v, Secret) or k in self.names or k in self.sources}
        for value in secret.values():
            self.masker.add(value)
        return secret, {k: v for k, v in pairs.items() if k not in secret}

    def split_for_atom(self, atom_name: str,
                       pairs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(secret, plain)`` of values injected into one atom's arguments."""
        names = set(self._args.get(atom_name, ()))
        secret = {k: reveal(v) for k, v in pairs.items() if k in names or isinstance(v, Secret)}
        for value in secret.values():
            self.masker.add(value)
        return secret, {k: v for k, v in pairs.items() if k not in secret}

    def note_arguments(self, atom_name: str, arguments: Mapping[str, Any]) -> None:
        """Mask the values of ``atom_name``'s secret arguments from now on."""
        for name in self._args.get(atom_name, ()):
            if name in arguments:
                self.masker.add(arguments[name])

    def note_result(self, mapping: Mapping[str, Any], result: Any,
                    item_from: Callable[[Any, Any], Any]) -> None:
        """Mask what an atom provides under a secret name, before its result is written."""
        if not (self.names or self.sources):
            return
        for name, index in mapping.items():
            if name in self.names or name in self.sources:
                try:
                    self.masker.add(item_from(result, index))
                except (IndexError, KeyError, TypeError):
                    pass

    def masked(self, value: Any) -> Any:
        """``value`` with the secrets masked (a Failure showing one is redacted)."""
        if not self.masker:
            return value
        if isinstance(value, Failure):
            return value.redacted(self.masker) if value.shows_any(self.masker) else value
        return self.masker.value(value)

    def stored_atom(self, ad: models.AtomDetail) -> models.AtomDetail:
        """What is written of ``ad``: a masked copy when there are secrets."""
        if not self.masker:
            return ad
        data = ad.to_dict()
        data.update({key: self.masker.value(data[key]) for key in _VALUE_FIELDS})
        stored = type(ad).from_dict(data)
        stored.times = dict(ad.times)  # not a value, and not part of to_dict()
        return stored

    def stored_flow(self, flow_detail: models.FlowDetail,
                    with_atoms: bool = True) -> models.FlowDetail:
        """What is written of ``flow_detail``: a masked copy when there are secrets."""
        if not self.masker:
            return flow_detail
        fd = flow_detail.copy(retain_contents=False)
        fd.meta = self.masker.value(fd.meta)
        if with_atoms:
            for ad in flow_detail:
                fd.add(self.stored_atom(ad))
        return fd
