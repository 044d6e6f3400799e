"""The rolling-upgrade test's task code, in two versions: ``$ROLLING_VERSION`` (1 or 2) says
which one a process runs, as old and new code of one service would on its hosts.

Each execution writes one line to the ledger (``$ROLLING_LEDGER``, set for the workers): the
major version the engine asked for (its code's), the version this worker serves, the worker's
pid, the flow and the task.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from flowengine import task
from flowengine.flows import linear_flow

VERSION = (int(os.environ.get("ROLLING_VERSION", "1")), 0)


class _Versioned(task.Task):
    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.version = VERSION

    def execute(self, flow: str, asked: int) -> None:
        threading.Event().wait(0.2)  # work that takes a moment, so the restarts overlap it
        with open(os.environ["ROLLING_LEDGER"], "a", encoding="utf-8") as out:
            out.write(f"{asked} {self.version[0]} {os.getpid()} {flow} {self.name}\n")


class Drain(_Versioned):
    """Drains a host."""


class Reboot(_Versioned):
    """Reboots a host."""


def make_flow(flow: str) -> Any:
    """Drain, then reboot, then drain again: three requests of two classes."""
    return linear_flow.Flow(flow).add(Drain("drain"), Reboot("reboot"), Drain("undrain"))
