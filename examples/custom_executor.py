"""A custom task executor: every call an engine makes goes through ``submit(work)``.

Part 1 subclasses the serial executor and sees each call as a ``Work`` value (the task, the
action, the arguments) before running it: one place for placement, auditing or quotas. Part 2
is an executor written against TaskFlow's interface (``execute_task`` and ``revert_task``
only): the default ``submit`` calls them, so it runs flows unchanged, reverts included.

Run: python examples/custom_executor.py
"""

import concurrent.futures as cf
from collections.abc import Mapping
from typing import Any

from flowengine import engines, task
from flowengine.engines import executor as ex
from flowengine.flows import linear_flow
from flowengine.types.failure import Failure


class Reserve(task.Task):
    def execute(self, seat: str) -> str:
        return f"reserved {seat}"

    def revert(self, seat: str, **kwargs: Any) -> None:
        print(f"  undo reservation of {seat}")


class Charge(task.Task):
    def execute(self, seat: str) -> None:
        raise RuntimeError(f"card declined for {seat}")


class Audited(ex.SerialTaskExecutor):
    """Prints each call it is handed, then runs it as the serial executor does."""

    def submit(self, work: ex.Work) -> cf.Future:
        print(f"  {work.action} {work.task.name} with {dict(work.arguments)}")
        return super().submit(work)


class TaskFlowStyle(ex.TaskExecutor):
    """TaskFlow's executor interface, calls run by a serial executor."""

    def __init__(self) -> None:
        self._runner = ex.SerialTaskExecutor()

    def execute_task(self, task: task.Task, task_uuid: str, arguments: Mapping[str, Any],
                     progress_callback: Any = None) -> cf.Future:
        print(f"  execute_task({task.name})")
        return self._runner.execute_task(task, task_uuid, arguments, progress_callback)

    def revert_task(self, task: task.Task, task_uuid: str, arguments: Mapping[str, Any],
                    result: Any, failures: Mapping[str, Failure],
                    progress_callback: Any = None) -> cf.Future:
        print(f"  revert_task({task.name})")
        return self._runner.revert_task(task, task_uuid, arguments, result, failures,
                                        progress_callback)


def booking() -> linear_flow.Flow:
    return linear_flow.Flow("booking").add(Reserve("reserve"), Charge("charge"))


def main() -> None:
    for name, executor in (("audited", Audited()), ("taskflow-style", TaskFlowStyle())):
        print(f"{name}:")
        engine = engines.load(booking(), engine="parallel", executor=executor,
                              store={"seat": "12A"})
        try:
            engine.run()
        except RuntimeError as err:
            print(f"  failed: {err}; flow {engine.storage.get_flow_state()}")


if __name__ == "__main__":
    main()
