"""Which stored flow factories may be imported and called to rebuild a flow.

A flow detail saved with factory details (:func:`flowengine.engines.save_factory_details`, a
posted job, ``flowengine run``) names its factory by import path, with arguments. Whoever can
write a record or post a job chooses both, and rebuilding the flow imports the module and calls
the factory in the process that does it: a conductor, ``flowengine run --resume``, the
dashboard, a service calling :func:`~flowengine.engines.load_from_detail`. So every rebuild
goes through a :class:`FactoryPolicy`, whose rule is:

* The name is ``module.attribute``, and neither the module nor the module that defines the
  attribute is in Python's standard library or builtins (checked before importing anything,
  since importing can itself run code), nor flowengine's own modules (except
  :func:`flowengine.cli.loading.flow_from_spec`, ``flowengine run``'s rebuilder, which applies
  this same policy to the flow it names).
* The attribute is a function or a class written in Python: never a builtin, a
  ``functools.partial`` or another callable object, so ``os.system`` or a re-exported
  ``subprocess.run`` is refused wherever it is re-exported from.
* When the policy names allowed modules (``FLOWENGINE_ALLOW_FACTORIES=myapp,billing.flows``,
  or ``--allow-factories``), the module is one of them or inside one of them. An empty list
  allows nothing: the dashboard's default, which draws a flow from its stored atoms alone.

TaskFlow's API is unchanged: a factory defined in the program's own modules (or in the script
that runs, ``__main__``) is rebuilt as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ENV_VAR", "FactoryPolicy", "FactoryRefused", "applying", "current"]

#: The environment variable naming the allowed modules (comma-separated) for every process.
ENV_VAR = "FLOWENGINE_ALLOW_FACTORIES"
#: flowengine's own factories that may be stored: they apply the policy to what they rebuild.
_OWN_FACTORIES = frozenset({"flowengine.cli.loading.flow_from_spec"})
_ALWAYS_REFUSED = frozenset({"builtins", "__builtin__", "flowengine"})


class FactoryRefused(ImportError):
    """A stored factory the policy does not allow; the message names it and the rule."""


@dataclasses.dataclass(frozen=True)
class FactoryPolicy:
    """Which stored factories may be imported and called (see the module for the rule).

    Attributes:
        modules: The allowed modules (each allows its submodules too); None allows any module
            outside the standard library and flowengine; an empty tuple allows none.
    """

    modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in self.modules or ():
            if not name or not all(part.isidentifier() for part in name.split(".")):
                raise ValueError(f"{name!r} is not a module name (like myapp.flows)")

    @classmethod
    def from_names(cls, text: str | None) -> FactoryPolicy:
        """The policy a comma-separated module list gives (None or blank: any module).

        Raises:
            ValueError: naming an entry that is not a module name.
        """
        if text is None or not text.strip():
            return cls()
        return cls(tuple(part.strip() for part in text.split(",") if part.strip()))

    @classmethod
    def from_environment(cls) -> FactoryPolicy:
        """The policy :data:`ENV_VAR` gives (unset: any module outside the stdlib)."""
        return cls.from_names(os.environ.get(ENV_VAR))

    @property
    def allows_any(self) -> bool:
        """Whether some factory could pass (False for an empty module list)."""
        return self.modules != ()

    def describe(self) -> str:
        """The rule, in a few words (for messages)."""
        if self.modules is None:
            return "factories from any module outside Python's standard library and flowengine"
        if not self.modules:
            return "no factory module (give --allow-factories MODULE to allow some)"
        return f"factories from the modules {', '.join(self.modules)} only"

    def check_module(self, module: str, what: str) -> None:
        """Refuse ``module`` (before importing it) unless the rule allows it.

        Raises:
            FactoryRefused: naming ``what`` and the rule.
        """
        real = _real_name(module)
        top = real.partition(".")[0]
        if top in _ALWAYS_REFUSED or top in sys.stdlib_module_names:
            raise FactoryRefused(f"{what} comes from module {real!r}, part of "
                                 f"{'flowengine' if top == 'flowengine' else 'Python'} itself:"
                                 f" stored factories never may")
        if self.modules is not None and not any(
                real == allowed or real.startswith(allowed + ".") for allowed in self.modules):
            raise FactoryRefused(f"{what} comes from module {real!r}; this process allows "
                                 f"{self.describe()}")

    def fetch(self, name: str) -> Callable[..., Any]:
        """Import the factory ``module.attribute`` if the rule allows it.

        Raises:
            FactoryRefused: the rule refuses it (the message says why).
            ImportError: it cannot be imported (as :func:`importlib.import_module` says).
            AttributeError: the module has no such attribute.
            ValueError: the name has no module part.
        """
        module_name, _, attr = name.rpartition(".")
        what = f"stored factory {name!r}"
        if module_name:
            if name not in _OWN_FACTORIES:
                self.check_module(module_name, what)
            elif self.modules == ():
                raise FactoryRefused(f"{what}: this process allows {self.describe()}")
        found = getattr(importlib.import_module(module_name), attr)
        if name not in _OWN_FACTORIES:
            self.check_object(found, what)
        return found  # type: ignore[no-any-return]

    def check_object(self, found: Any, what: str) -> None:
        """Refuse a factory that is not a Python function or class of an allowed module.

        Raises:
            FactoryRefused: naming ``what`` and what it is.
        """
        if not (inspect.isfunction(found) or inspect.isclass(found)):
            raise FactoryRefused(f"{what} is a {type(found).__name__}, not a function or class "
                                 f"written in Python")
        self.check_module(str(getattr(found, "__module__", "") or "builtins"),
                          f"{what} (defined as {getattr(found, '__qualname__', found)!s})")


def _real_name(module: str) -> str:
    """``module``, or for ``__main__`` the name it was run by (``python -m pkg.mod``)."""
    if module != "__main__":
        return module
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return str(getattr(spec, "name", None) or module)


_CURRENT: contextvars.ContextVar[FactoryPolicy | None] = contextvars.ContextVar(
    "flowengine_factory_policy", default=None)


def current() -> FactoryPolicy:
    """The policy in force: the one :func:`applying` set, else :data:`ENV_VAR`'s."""
    return _CURRENT.get() or FactoryPolicy.from_environment()


@contextlib.contextmanager
def applying(policy: FactoryPolicy) -> Iterator[FactoryPolicy]:
    """Make ``policy`` the one in force (on this thread) while the block runs."""
    token = _CURRENT.set(policy)
    try:
        yield policy
    finally:
        _CURRENT.reset(token)
