"""Tasks for the lease tests (importable, as remote tasks must be)."""

from flowengine import task


class Slow(task.Task):
    """Stands for work whose worker goes silent; the test's scripted worker never runs it."""

    def execute(self) -> str:
        return "done"
