"""Tasks of the tracing tests (importable by name, as remote tasks must be)."""

from __future__ import annotations

import logging

from flowengine import retry, task

LOG = logging.getLogger("tracing_tasks")


class Note(task.Task):
    """Logs one line (the log filter stamps it with the current span) and returns its input."""

    def execute(self, value: int) -> int:
        LOG.info("note %s", self.name)
        return value + 1


class ContextNote(task.Task):
    """Logs one line through its context's logger (which adds the ids and the span's)."""

    def execute(self) -> str:
        from flowengine import context

        context.current().logger.info("context note %s", self.name)
        return self.name


class Fail(task.Task):
    """Fails with a message naming a secret argument (which a span must never show)."""

    secret_args = ("password",)

    def execute(self, password: str) -> None:
        raise RuntimeError(f"cannot log in with {password}")


class FailReaching(task.Task):
    """Fails with a message quoting a broker URL with its password (no secret argument)."""

    def execute(self, url: str) -> None:
        raise ConnectionError(f"cannot reach {url}")


class FailOnce(task.Task):
    """Fails on its first execution in this process, succeeds afterwards."""

    failed: set[str] = set()

    def execute(self) -> str:
        if self.name not in FailOnce.failed:
            FailOnce.failed.add(self.name)
            raise ValueError(f"{self.name} fails once")
        return "ok"


def retry_twice(name: str) -> retry.Times:
    """A retry controller allowing two attempts."""
    return retry.Times(2, name=name)
