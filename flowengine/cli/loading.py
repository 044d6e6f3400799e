"""Finding the flow a ``module:attribute`` names, and the options that feed it.

``module:attribute`` names either a flow factory (a callable returning a flow or an atom) or a
flow object. Modules are imported as ``python -m`` would: the current directory comes first.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click

from flowengine.atom import Atom
from flowengine.flow import Flow

SPEC_METAVAR = "MODULE:FACTORY"


class LoadError(click.ClickException):
    """The flow cannot be imported or built (exit code 1); the message says what and why."""


def ensure_cwd_on_path() -> None:
    """Let modules in the current directory be imported, as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def import_target(spec: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and return the object it names.

    Raises:
        click.BadParameter: ``spec`` is not ``module:attr``.
        LoadError: the module cannot be imported or has no such attribute.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(
            f"{spec!r} is not of the form module:attribute (e.g. myapp.flows:make_flow)",
            param_hint=SPEC_METAVAR)
    ensure_cwd_on_path()
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise LoadError(
                f"cannot import module {module_name!r} (from {spec!r}): no module named "
                f"{err.name!r} in the current directory or on sys.path") from err
        raise LoadError(f"importing module {module_name!r} (from {spec!r}) failed: {err}") from err
    except Exception as err:
        raise LoadError(f"importing module {module_name!r} (from {spec!r}) raised "
                        f"{type(err).__name__}: {err}") from err
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as err:
            raise LoadError(f"cannot import {attr!r} from module {module_name!r}: "
                            f"{type(obj).__name__} {getattr(obj, '__name__', obj)!r} has no "
                            f"attribute {part!r}") from err
    return obj


def build_flow(spec: str, target: Any, args: Sequence[Any] = (),
               kwargs: Mapping[str, Any] | None = None) -> Any:
    """The flow ``target`` is (a flow or atom) or makes (a factory called with the arguments).

    Raises:
        LoadError: the factory raised, returned something else than a flow or atom, or
            arguments were given for a flow object.
    """
    if isinstance(target, Flow | Atom):
        if args or kwargs:
            raise LoadError(f"{spec!r} is a flow object, not a factory: --arg/--kwarg do not apply")
        return target
    if not callable(target):
        raise LoadError(f"{spec!r} is a {type(target).__name__}, not a flow or a flow factory")
    try:
        flow = target(*args, **(kwargs or {}))
    except Exception as err:
        raise LoadError(f"flow factory {spec!r} raised {type(err).__name__}: {err}") from err
    if not isinstance(flow, Flow | Atom):
        raise LoadError(f"flow factory {spec!r} returned {flow!r} ({type(flow).__name__}), "
                        f"not a flow or an atom")
    return flow


def flow_from_spec(spec: str, args: Sequence[Any] = (),
                   kwargs: Mapping[str, Any] | None = None) -> Any:
    """Rebuild the flow ``spec`` names; recorded as the factory of runs whose target is not a
    module-level function (a flow object, a lambda), so that they can be resumed.

    Being a stored factory's way to another target, it applies the factory policy in force
    (:mod:`flowengine.engines.factory_policy`) to ``spec``: its module before importing it, and
    what it names before calling it, unless that is a flow or atom object (nothing is called).

    Raises:
        flowengine.engines.factory_policy.FactoryRefused: the policy refuses ``spec``.
    """
    from flowengine.engines import factory_policy

    policy = factory_policy.current()
    what = f"flow {spec!r}"
    policy.check_module(str(spec).partition(":")[0], what)
    target = import_target(spec)
    if not isinstance(target, Flow | Atom):
        policy.check_object(target, what)
    return build_flow(spec, target, args, kwargs)


def factory_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --arg and --kwarg (the flow factory's arguments)."""
    decorators = [
        click.option("--arg", "factory_args", multiple=True, envvar="FLOWENGINE_ARG",
                     help="Positional argument for the flow factory (JSON, else text). "
                          "Repeatable."),
        click.option("--kwarg", "factory_kwargs", multiple=True,
                     envvar="FLOWENGINE_KWARG",
                     help="Keyword argument key=value for the flow factory (JSON value, else "
                          "text). Repeatable."),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def allow_factories_option(default_rule: str) -> Callable[[Callable[..., Any]],
                                                          Callable[..., Any]]:
    """Add --allow-factories MODULE[,MODULE] (passed as ``allow_factories``, a string or None);
    ``default_rule`` says what is allowed without it."""
    # factory_policy.ENV_VAR, named here so that --help does not import the engines.
    return click.option(
        "--allow-factories", "allow_factories", envvar="FLOWENGINE_ALLOW_FACTORIES",
        default=None,
        metavar="MODULE[,MODULE]",
        help="Modules whose functions and classes a stored flow may name as its factory, to "
             f"rebuild it (each allows its submodules). Without it: {default_rule}. Never the "
             "standard library, builtins or flowengine.")


def factory_policy_of(allow_factories: str | None, default: Any = None) -> Any:
    """The :class:`~flowengine.engines.factory_policy.FactoryPolicy` ``--allow-factories``
    gives (``default`` when it was not given; None: any module outside the stdlib).

    Raises:
        click.BadParameter: an entry is not a module name.
    """
    from flowengine.engines.factory_policy import FactoryPolicy

    if allow_factories is None or not allow_factories.strip():
        return default if default is not None else FactoryPolicy()
    try:
        return FactoryPolicy.from_names(allow_factories)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--allow-factories") from err


def store_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --store (values injected into the flow's storage)."""
    return click.option(
        "--store", "store", multiple=True, envvar="FLOWENGINE_STORE",
        help="Value the flow's atoms can require: key=value (JSON value, else text). "
             "Repeatable (space-separated in the env var).")(command)


def secret_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --secret (store values kept secret: never stored, masked wherever shown)."""
    return click.option(
        "--secret", "secret", multiple=True, envvar="FLOWENGINE_SECRET",
        help="A store value to keep secret (never stored; masked in output and logs): "
             "key=value. Repeatable (space-separated in the env var).")(command)


def parse_args(values: Sequence[str]) -> list[Any]:
    """Factory positional arguments: JSON when they parse as JSON, else text."""
    found: list[Any] = []
    for value in values:
        try:
            found.append(json.loads(value))
        except ValueError:
            found.append(value)
    return found
