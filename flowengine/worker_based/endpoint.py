"""A task class a worker can run, named on the wire by its fully-qualified class name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flowengine import task as task_mod
from flowengine.types import notifier as notifier_mod
from flowengine.types.failure import Failure
from flowengine.worker_based import protocol as pr

#: Gets ``(event_type, details)`` for every event the task emits while it runs.
EventCallback = Callable[..., None]


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

    def generate(self, name: str | None = None) -> task_mod.Task:
        """A fresh task instance named ``name`` (only the name travels on the wire)."""
        return self._task_cls(name=name)

    def execute(
        self,
        task: task_mod.Task,
        arguments: Mapping[str, Any],
        event_callback: EventCallback | None = None,
    ) -> Any:
        """Run ``pre_execute``, ``execute(**arguments)`` and ``post_execute``.

        Returns:
            What ``execute`` returned, or a :class:`Failure` capturing what it raised.
        """
        with _forwarding(task, event_callback):
            try:
                task.pre_execute()
                return task.execute(**arguments)
            except Exception:
                return Failure()
            finally:
                task.post_execute()

    def revert(
        self,
        task: task_mod.Task,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure] | None,
        event_callback: EventCallback | None = None,
    ) -> Any:
        """Run ``pre_revert``, ``revert(**arguments, result=, flow_failures=)``, ``post_revert``.

        Returns:
            What ``revert`` returned, or a :class:`Failure` capturing what it raised.
        """
        kwargs = dict(arguments, result=result, flow_failures=dict(failures or {}))
        with _forwarding(task, event_callback):
            try:
                task.pre_revert()
                return task.revert(**kwargs)
            except Exception:
                return Failure()
            finally:
                task.post_revert()


def _forwarding(task: task_mod.Task, callback: EventCallback | None) -> Any:
    # Every event the task may emit is forwarded (for a plain Task, 'update_progress'), as a
    # TaskFlow worker forwards everything its task's notifier allows.
    notifier = task.notifier
    event = notifier_mod.Notifier.ANY
    if not notifier.can_be_registered(event):
        event = task_mod.EVENT_UPDATE_PROGRESS
    return notifier_mod.register_deregister(notifier, event, callback)
