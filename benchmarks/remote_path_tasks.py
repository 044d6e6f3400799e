"""The no-op tasks ``remote_path.py`` sends to a worker (importable by name, as workers need)."""

from __future__ import annotations

from flowengine import task


class Noop(task.Task):
    """Does nothing: the request's own path is what is measured."""

    def execute(self) -> None:
        return None


try:
    from taskflow import task as tf_task
except ImportError:  # TaskFlow is optional (the test extras install it)
    tf_task = None

if tf_task is not None:

    class TaskflowNoop(tf_task.Task):  # type: ignore[misc]
        """The same no-op task for TaskFlow's worker."""

        def execute(self) -> None:
            return None
