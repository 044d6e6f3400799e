"""Atoms: the smallest units a flow is made of (tasks and retry controllers).

An atom declares what it needs (``requires``, derived from its ``execute`` signature unless told
otherwise), how its arguments are bound to stored names (``rebind``), and what its result is saved
as (``provides``). The engine resolves those names against storage before calling it.
"""

from __future__ import annotations

import abc
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Arguments the engine passes to ``revert`` itself; never looked up in storage.
REVERT_RESULT = "result"
REVERT_FLOW_FAILURES = "flow_failures"
_DEFAULT_REVERT_ARGS = (REVERT_RESULT, REVERT_FLOW_FAILURES)

RebindSpec = Mapping[str, str] | Iterable[str] | None
ProvidesSpec = str | Iterable[str] | None


def save_as_mapping(provides: ProvidesSpec) -> dict[str, Any]:
    """Turn a ``provides`` value into ``{name: index}`` where index locates it in the result.

    A string names the whole result (index ``None``); a tuple or list names the result's items by
    position; a set (or any other iterable) names items of a dict-like result by key.
    """
    if provides is None:
        return {}
    if isinstance(provides, str):
        return {provides: None}
    if isinstance(provides, (tuple, list)):
        return {name: index for index, name in enumerate(provides)}
    if isinstance(provides, Iterable):
        return {name: name for name in provides}
    # TaskFlow's wording first (programs match on it).
    raise TypeError(f"Atom provides parameter should be str, set or tuple/list, not "
                    f"{provides!r} ({type(provides).__name__})")


def _callable_args(function: Callable[..., Any]) -> tuple[list[str], list[str], bool]:
    """Return (required positional names, all names, accepts **kwargs) of a bound callable."""
    # Bound methods of one class share a function, so the (costly) inspection is done once.
    underlying = getattr(function, "__func__", None)
    if underlying is not None:
        try:
            required, every, accepts = _function_args(underlying)
        except TypeError:  # unhashable callables are inspected each time
            return _inspect_args(function)
        # Drop the bound argument (self/cls), which the bound callable does not take.
        return required[1:] if required else required, every[1:], accepts
    return _inspect_args(function)


@functools.lru_cache(maxsize=4096)
def _function_args(function: Callable[..., Any]) -> tuple[list[str], list[str], bool]:
    return _inspect_args(function)


def _inspect_args(function: Callable[..., Any]) -> tuple[list[str], list[str], bool]:
    required: list[str] = []
    every: list[str] = []
    accepts_kwargs = False
    for param in inspect.signature(function).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            accepts_kwargs = True
        elif param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            every.append(param.name)
            if param.default is param.empty:
                required.append(param.name)
    return required, every, accepts_kwargs


def _rebind_mapping(required: list[str], rebind: RebindSpec) -> dict[str, str]:
    if rebind is None:
        return {}
    if isinstance(rebind, Mapping):
        return dict(rebind)
    if isinstance(rebind, (list, tuple)):
        # A list rebinds positionally; entries past the required arguments name extra ones.
        mapping = dict(zip(required, rebind))
        mapping.update((name, name) for name in rebind[len(required):])
        return mapping
    raise TypeError(f"Invalid rebind value '{rebind}' ({type(rebind)}): it must be a dict, list "
                    f"or tuple")


def build_arg_mapping(
    atom_name: str | None,
    requires: str | Iterable[str] | None,
    rebind: RebindSpec,
    function: Callable[..., Any],
    auto_extract: bool,
    ignore_list: Iterable[str] = (),
) -> tuple[dict[str, str], dict[str, str]]:
    """Work out how ``function``'s arguments are fetched from storage.

    Returns:
        ``(required, optional)``: both map an argument name to the stored name it is read from.
        Optional arguments (those with defaults) are passed only when something provides them.

    Raises:
        ValueError: an argument cannot be bound, or a bound name is not an argument of a
            function without ``**kwargs``; the message names the atom.
    """
    ignored = set(ignore_list)
    positional, every, accepts_kwargs = _callable_args(function)
    positional = [name for name in positional if name not in ignored]
    required: dict[str, str] = {}
    if auto_extract:
        required.update((name, name) for name in positional)
    if requires:
        names = [requires] if isinstance(requires, str) else list(requires)
        required.update((name, name) for name in names)
    required.update(_rebind_mapping(positional, rebind))
    optional: dict[str, str] = {}
    if auto_extract:
        optional = {n: n for n in every if n not in required and n not in ignored}
    if not accepts_kwargs:
        extra = [name for name in required if name not in every]
        if extra:
            raise ValueError(f"Extra arguments given to atom {atom_name!r}: {extra}")
    missing = [name for name in positional if name not in required]
    if missing:
        raise ValueError(f"Missing arguments for atom {atom_name!r}: {missing}")
    return required, optional


def _bind(
    atom_name: str | None,
    requires: str | Iterable[str] | None,
    rebind: RebindSpec,
    function: Callable[..., Any],
    auto_extract: bool,
    ignore_list: Iterable[str],
) -> tuple[dict[str, str], frozenset[str], frozenset[str]]:
    """Return ``(argument -> stored name, required stored names, optional stored names)``."""
    required, optional = build_arg_mapping(
        atom_name, requires, rebind, function, auto_extract, ignore_list
    )
    mapping = dict(required)
    for arg, stored in optional.items():
        mapping.setdefault(arg, stored)
    return mapping, frozenset(required.values()), frozenset(optional.values())


class Atom(metaclass=abc.ABCMeta):
    """Base of everything a flow can contain besides other flows.

    Args:
        name: unique name within the flow (tasks default to their class's qualified name).
        provides: name(s) the result is stored under; see :func:`save_as_mapping`.
        requires: extra stored names to pass to ``execute`` as keyword arguments.
        auto_extract: derive requirements from ``execute``'s signature.
        rebind: map argument names to other stored names (dict), or positionally (list).
        inject: constant argument values for this atom only.
        ignore_list: argument names never fetched from storage.
        revert_rebind: like ``rebind`` for ``revert`` (defaults to ``rebind``).
        revert_requires: like ``requires`` for ``revert`` (defaults to ``requires``).
    """

    #: Higher priorities are scheduled first when several atoms are ready.
    priority: int = 0
    #: What the atom provides when the constructor's ``provides`` is not given.
    default_provides: ProvidesSpec = None
    #: Names of arguments whose values are secret (flowengine addition): they are masked in
    #: every failure the atom produces before it is stored, logged, sent or evented.
    secret_args: tuple[str, ...] = ()

    def __init__(
        self,
        name: str | None = None,
        provides: ProvidesSpec = None,
        requires: str | Iterable[str] | None = None,
        auto_extract: bool = True,
        rebind: RebindSpec = None,
        inject: Mapping[str, Any] | None = None,
        ignore_list: Iterable[str] | None = None,
        revert_rebind: RebindSpec = None,
        revert_requires: str | Iterable[str] | None = None,
    ) -> None:
        if provides is None:
            provides = self.default_provides
        # None only until a flow names its retry controller; engines only see named atoms.
        self.name: str = name  # type: ignore[assignment]
        self.version: tuple[int, ...] = (1, 0)
        self.inject: dict[str, Any] | None = dict(inject) if inject else inject  # type: ignore[assignment]
        self.save_as = save_as_mapping(provides)
        self.provides: frozenset[str] = frozenset(self.save_as)
        ignored = list(ignore_list or ())
        self.rebind, exec_requires, self.optional = _bind(
            name, requires, rebind, self._execute_signature(), auto_extract, ignored
        )
        self.revert_rebind, revert_requires_, self.revert_optional = _bind(
            name,
            revert_requires if revert_requires is not None else requires,
            revert_rebind if revert_rebind is not None else rebind,
            self._revert_signature(),
            auto_extract,
            ignored + list(_DEFAULT_REVERT_ARGS),
        )
        # Injected names are this atom's own values: nothing else has to provide them (TaskFlow).
        injected = frozenset(self.inject or ())
        self.requires: frozenset[str] = (exec_requires | revert_requires_) - injected

    def _execute_signature(self) -> Callable[..., Any]:
        """The callable whose signature ``execute``'s arguments are inferred from."""
        return self.execute

    def _revert_signature(self) -> Callable[..., Any]:
        """The callable whose signature ``revert``'s arguments are inferred from."""
        return self.revert

    def pre_execute(self) -> None:
        """Called just before ``execute``."""

    @abc.abstractmethod
    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Do the atom's work and return its result."""

    def post_execute(self) -> None:
        """Called just after ``execute``."""

    def pre_revert(self) -> None:
        """Called just before ``revert``."""

    @abc.abstractmethod
    def revert(self, *args: Any, **kwargs: Any) -> Any:
        """Undo what ``execute`` did (``result`` and ``flow_failures`` are passed in)."""

    def post_revert(self) -> None:
        """Called just after ``revert``."""

    def __str__(self) -> str:
        return f'"{self.name}==' + ".".join(str(part) for part in self.version) + '"'

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__qualname__} {self}>"
