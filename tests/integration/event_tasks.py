"""Tasks the event-stream tests run on workers (in-process and ``flowengine worker`` processes)."""

from __future__ import annotations

from flowengine import task

#: The secret the leaky task is given, and the broker password its message names.
SECRET = "s3cr3t-pw"
URL_PASSWORD = "hunter2"


class Add(task.Task):
    def execute(self, x: int) -> int:
        return x + 1


class Leaky(task.Task):
    """Fails with its secret argument and a broker URL with a password in the message."""

    secret_args = ("password",)

    def execute(self, password: str) -> None:
        raise ValueError(f"login with {password} to redis://svc:{URL_PASSWORD}@cache:6379/0"
                         " refused")


class Halfway(task.Task):
    """Reports being half done, then returns."""

    def execute(self) -> str:
        self.update_progress(0.5)
        return "done"


class Fail(task.Task):
    def execute(self) -> None:
        raise RuntimeError("cannot go on")


class BadRevert(task.Task):
    """Runs; its revert fails."""

    def execute(self) -> str:
        return "made"

    def revert(self, **kwargs: object) -> None:
        raise RuntimeError("cannot be undone")
