"""The provisioning steps of ``demo_workers.py``; its worker processes import this module.

A worker rebuilds each task from its class name as ``cls(name=...)``, so every step is its own
class: what it does is fixed by the class, and its inputs arrive from the engine. Each step works
for a moment in slices and reports its progress after each one. Inside a worker process started by
``worker_processes.py`` the progress events also name the worker that sent them, which is how the
engine side shows who ran what.
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from worker_processes import WORKER_NAME_ENV

from flowengine import task


class Step(task.Task):
    """A step that takes ``work_seconds`` and returns ``resource``."""

    work_seconds: ClassVar[float] = 0.4
    slices: ClassVar[int] = 4
    resource: ClassVar[str] = ""

    def update_progress(self, progress: float) -> None:
        """Report progress, adding the name of the worker process this runs in."""
        worker = os.environ.get(WORKER_NAME_ENV)
        if worker is None:  # the engine's own copy of the task (it reports 0% and 100%)
            super().update_progress(progress)
            return
        progress = min(max(progress, 0.0), 1.0)
        self.notifier.notify(task.EVENT_UPDATE_PROGRESS, {"progress": progress, "worker": worker})

    def work(self) -> None:
        """Sleep through ``work_seconds`` in slices, reporting progress between them."""
        for done in range(1, self.slices + 1):
            time.sleep(self.work_seconds / self.slices)
            if done < self.slices:
                self.update_progress(done / self.slices)

    def revert(self, *args: Any, **kwargs: Any) -> None:
        """Undo the step (quicker than doing it)."""
        self.update_progress(0.5)
        time.sleep(self.work_seconds / self.slices)


class AllocateIp(Step):
    default_provides = "ip"
    resource = "10.0.0.7"

    def execute(self) -> str:
        self.work()
        return self.resource


class CreateVolume(Step):
    default_provides = "volume"
    resource = "vol-3f2a"
    work_seconds = 0.6

    def execute(self) -> str:
        self.work()
        return self.resource


class FetchImage(Step):
    default_provides = "image"
    resource = "debian-12"

    def execute(self) -> str:
        self.work()
        return self.resource


class BootServer(Step):
    default_provides = "server"
    resource = "srv-81c4"

    def execute(self, ip: str, image: str) -> str:
        self.work()
        return self.resource


class AttachVolume(Step):
    default_provides = "attachment"
    work_seconds = 0.3

    def execute(self, server: str, volume: str) -> str:
        self.work()
        return f"{volume}@{server}"


class HealthCheck(Step):
    """Fails when the engine stores ``simulate_outage=True``."""

    default_provides = "health"
    work_seconds = 0.3

    def execute(self, attachment: str, simulate_outage: bool) -> str:
        self.work()
        if simulate_outage:
            raise ConnectionError("server did not answer on port 22")
        return "ok"
