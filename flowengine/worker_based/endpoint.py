"""A task class a worker can run, named on the wire by its fully-qualified class name."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flowengine import task as task_mod
from flowengine.engines import executor as local
from flowengine.types.failure import Failure
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.wire import versions

#: Gets ``(event_type, details=...)`` for each event the task emits while it runs (progress and
#: the task's own, ``task.notifier.notify(...)``): the worker sends each to the engine.
ProgressCallback = Callable[..., None]


@contextlib.contextmanager
def _forwarding(task: task_mod.Task, callback: ProgressCallback | None) -> Iterator[None]:
    """Every event ``task`` notifies goes to ``callback`` meanwhile, as TaskFlow's worker does."""
    if callback is None:
        yield
        return
    notifier = task.notifier
    notifier.register(notifier.ANY, callback)
    try:
        yield
    finally:
        notifier.deregister(notifier.ANY, callback)


class Endpoint:
    """Builds and runs instances of one task class, locally, for remote requests.

    Args:
        task_cls: A :class:`~flowengine.task.Task` subclass.
    """

    def __init__(self, task_cls: type[task_mod.Task]) -> None:
        if not (isinstance(task_cls, type) and issubclass(task_cls, task_mod.Task)):
            raise TypeError(f"Endpoint needs a Task subclass, got {task_cls!r}")
        self._task_cls = task_cls
        self._name = pr.task_class_name(task_cls)

    @property
    def name(self) -> str:
        """The fully-qualified class name engines address this endpoint by."""
        return self._name

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<Endpoint {self._name}>"

    @functools.cached_property
    def version(self) -> str | None:
        """The class's version (``"2.0"``), read from an instance made once; None when the
        class cannot be made without arguments (nothing is announced for it then)."""
        try:
            made = self.generate()
        except Exception:  # a class that needs arguments: it still runs, unannounced
            return None
        return versions.text(made.version)

    def generate(self, name: str | None = None) -> task_mod.Task:
        """A fresh task instance named ``name`` (only the name travels on the wire)."""
        return self._task_cls(name=name)

    def awaits(self, action: str) -> bool:
        """Whether ``action`` (``execute`` or ``revert``) is an ``async def`` of this class."""
        return action in (pr.EXECUTE, pr.REVERT) and local.is_async(
            getattr(self._task_cls, action, None))

    def execute(
        self,
        task: task_mod.Task,
        arguments: Mapping[str, Any],
        progress_callback: ProgressCallback | None = None,
    ) -> Any:
        """Run ``pre_execute``, ``execute(**arguments)`` and ``post_execute`` here and now.

        Returns:
            What ``execute`` returned, or a :class:`Failure` capturing what it raised.
        """
        with _forwarding(task, progress_callback):
            return local.execute_task(task, arguments)[1]

    def revert(
        self,
        task: task_mod.Task,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure] | None,
        progress_callback: ProgressCallback | None = None,
    ) -> Any:
        """Run ``pre_revert``, ``revert(**arguments, result=, flow_failures=)``, ``post_revert``.

        Returns:
            What ``revert`` returned, or a :class:`Failure` capturing what it raised.
        """
        with _forwarding(task, progress_callback):
            return local.revert_task(task, arguments, result, dict(failures or {}))[1]

    async def execute_async(
        self,
        task: task_mod.Task,
        arguments: Mapping[str, Any],
        progress_callback: ProgressCallback | None = None,
    ) -> Any:
        """:meth:`execute` for an ``async def execute``: awaited here (on the caller's loop)."""
        with _forwarding(task, progress_callback):
            return (await local.execute_task_async(task, arguments))[1]

    async def revert_async(
        self,
        task: task_mod.Task,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure] | None,
        progress_callback: ProgressCallback | None = None,
    ) -> Any:
        """:meth:`revert` for an ``async def revert``: awaited here (on the caller's loop)."""
        with _forwarding(task, progress_callback):
            return (await local.revert_task_async(task, arguments, result,
                                                  dict(failures or {})))[1]
