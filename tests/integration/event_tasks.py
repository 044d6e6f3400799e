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
