"""Tasks: atoms that do work in ``execute`` and undo it in ``revert``."""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flowengine import atom
from flowengine.types import notifier

LOG = logging.getLogger(__name__)

#: The event a task emits (through its notifier) when it reports progress.
EVENT_UPDATE_PROGRESS = "update_progress"
#: The argument ``revert`` receives what ``execute`` returned (or its Failure) as.
REVERT_RESULT = atom.REVERT_RESULT
#: The argument ``revert`` receives every failure of the flow (``{atom name: Failure}``) as.
REVERT_FLOW_FAILURES = atom.REVERT_FLOW_FAILURES


def _class_name(obj: object) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class Task(atom.Atom):
    """An atom that performs work and knows how to undo it.

    Subclasses implement ``execute`` (its arguments are fetched from storage by name) and may
    implement ``revert``, which receives the same arguments plus ``result`` (what ``execute``
    returned, or a :class:`~flowengine.types.failure.Failure`) and ``flow_failures``.

    A task's default name is its fully-qualified class name.
    """

    #: Events a task may emit through :attr:`notifier`.
    TASK_EVENTS: tuple[str, ...] = (EVENT_UPDATE_PROGRESS,)
    #: Seconds an attempt may run before it fails with a time-limit failure (None: unbounded).
    time_limit: float | None = None
    #: Seconds each execution waits after the task is ready before it starts (flowengine
    #: addition; 0: none). Local engines keep the task PENDING meanwhile; a worker-based engine
    #: sends its request at once as a delayed dispatch. See doc/priorities.rst.
    start_delay: float = 0.0
    #: Locks held while the task executes or reverts (flowengine addition): names, with its
    #: arguments in braces (``("lb:{lb_id}",)``), on the engine's coordination service. See
    #: doc/coordination.rst.
    locks: tuple[str, ...] = ()
    #: More names the engine's ``concurrency`` limits count the task under, besides its class's
    #: name (flowengine addition; arguments in braces, as for :attr:`locks`).
    concurrency_keys: tuple[str, ...] = ()

    def __init__(
        self,
        name: str | None = None,
        provides: atom.ProvidesSpec = None,
        requires: str | Iterable[str] | None = None,
        auto_extract: bool = True,
        rebind: atom.RebindSpec = None,
        inject: Mapping[str, Any] | None = None,
        ignore_list: Iterable[str] | None = None,
        revert_rebind: atom.RebindSpec = None,
        revert_requires: str | Iterable[str] | None = None,
    ) -> None:
        if name is None:
            name = _class_name(self)
        super().__init__(
            name=name,
            provides=provides,
            requires=requires,
            auto_extract=auto_extract,
            rebind=rebind,
            inject=inject,
            ignore_list=ignore_list,
            revert_rebind=revert_rebind,
            revert_requires=revert_requires,
        )
        self._notifier = notifier.RestrictedNotifier(self.TASK_EVENTS)

    @property
    def notifier(self) -> notifier.RestrictedNotifier:
        """Where the task's own events (progress) are published."""
        return self._notifier

    def revert(self, *args: Any, **kwargs: Any) -> Any:
        """Undo ``execute``; the default does nothing."""

    def copy(self, retain_listeners: bool = True) -> Task:
        """Return a shallow copy, with or without the notifier's listeners."""
        clone = copy.copy(self)
        clone._notifier = self._notifier.copy()  # type: ignore[assignment]
        if not retain_listeners:
            clone._notifier.reset()
        return clone

    def update_progress(self, progress: float) -> None:
        """Report progress between 0.0 and 1.0 (values outside are clamped, with a warning)."""
        if progress > 1.0:
            LOG.warning("Progress %s of task %r is above 1.0; using 1.0", progress, self.name)
            progress = 1.0
        elif progress < 0.0:
            LOG.warning("Progress %s of task %r is below 0.0; using 0.0", progress, self.name)
            progress = 0.0
        self._notifier.notify(EVENT_UPDATE_PROGRESS, {"progress": progress})


#: TaskFlow's older name for the base class.
BaseTask = Task


class FunctorTask(Task):
    """A task built from a plain function (and optionally a revert function).

    Its default name is the function's fully-qualified name, and its requirements come from the
    function's signature.
    """

    def __init__(
        self,
        execute: Callable[..., Any],
        name: str | None = None,
        provides: atom.ProvidesSpec = None,
        requires: str | Iterable[str] | None = None,
        auto_extract: bool = True,
        rebind: atom.RebindSpec = None,
        revert: Callable[..., Any] | None = None,
        version: tuple[int, ...] | None = None,
        inject: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(execute):
            raise ValueError(f"Function to use for executing must be callable, not {execute!r}")
        if revert is not None and not callable(revert):
            raise ValueError(f"Function to use for reverting must be callable, not {revert!r}")
        if name is None:
            name = f"{execute.__module__}.{getattr(execute, '__qualname__', repr(execute))}"
        # Set before the base constructor inspects execute/revert signatures.
        self._execute = execute
        self._revert = revert
        super().__init__(
            name=name,
            provides=provides,
            requires=requires,
            auto_extract=auto_extract,
            rebind=rebind,
            inject=inject,
        )
        if version is not None:
            self.version = tuple(version)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function."""
        return self._execute(*args, **kwargs)

    def revert(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped revert function, if any."""
        if self._revert is not None:
            return self._revert(*args, **kwargs)
        return None

    def _execute_signature(self) -> Callable[..., Any]:
        return self._execute

    def _revert_signature(self) -> Callable[..., Any]:
        return self._revert if self._revert is not None else super()._revert_signature()


def _argument_count(function: Callable[..., Any]) -> int:
    """Named parameters of ``function``, with or without defaults (TaskFlow's rule)."""
    params = inspect.signature(function).parameters.values()
    return sum(1 for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


class _CollectionFunctorTask(Task):
    """Shared parts of the map and reduce functor tasks.

    As TaskFlow does, the functor and ``requires`` are checked when the task is built, so a
    function of the wrong shape never reaches a running flow.
    """

    #: TaskFlow's word for the operation in its messages, and what it requires of it.
    _operation = "map"
    _arity = 1
    _min_requires = 0

    def __init__(
        self,
        functor: Callable[..., Any],
        requires: Iterable[str],
        name: str | None = None,
        provides: atom.ProvidesSpec = None,
        auto_extract: bool = True,
        rebind: atom.RebindSpec = None,
        inject: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(functor):
            raise ValueError(f"Function to use for {self._operation} must be callable (task "
                             f"{name!r} was given {functor!r})")
        if name is None:
            name = f"{functor.__module__}.{getattr(functor, '__qualname__', repr(functor))}"
        try:
            count = _argument_count(functor)
        except (TypeError, ValueError) as err:
            raise ValueError(f"Task {name!r}: cannot tell how many arguments {functor!r} "
                             f"takes: {err}") from err
        if count != self._arity:
            plural = "" if self._arity == 1 else "s"
            raise ValueError(
                f"Task {name!r}: {count} arguments were provided. "
                f"{self._operation.capitalize()} functor must take exactly {self._arity} "
                f"argument{plural}."
            )
        if isinstance(requires, str) or not isinstance(requires, Iterable):
            raise TypeError(f"Task {name!r}: {type(requires)} type was provided for requires. "
                            f"Requires must be an iterable.")
        self._functor = functor
        self._names = list(requires)
        if len(self._names) < self._min_requires:
            raise ValueError(
                f"Task {name!r}: {len(self._names)} elements were provided. Requires must have "
                f"at least {self._min_requires} elements."
            )
        super().__init__(
            name=name,
            provides=provides,
            requires=self._names,
            auto_extract=auto_extract,
            rebind=rebind,
            inject=inject,
        )


class MapFunctorTask(_CollectionFunctorTask):
    """Apply a one-argument function to each required value; the result is a list."""

    def execute(self, **kwargs: Any) -> list[Any]:
        """Map the functor over the required values, in ``requires`` order."""
        return [self._functor(kwargs[name]) for name in self._names]


class ReduceFunctorTask(_CollectionFunctorTask):
    """Fold a two-argument function over the required values (at least two)."""

    _operation = "reduce"
    _arity = 2
    _min_requires = 2

    def execute(self, **kwargs: Any) -> Any:
        """Reduce the required values left to right with the functor."""
        values = [kwargs[name] for name in self._names]
        result = values[0]
        for value in values[1:]:
            result = self._functor(result, value)
        return result
