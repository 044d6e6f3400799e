"""The worker-limit test's task: records its start and end in ``$LIMIT_LEDGER`` and waits, in
between, for the file ``$LIMIT_GATE`` (written by the test) to exist."""

from __future__ import annotations

import os
import time
from pathlib import Path

from flowengine import task


def _record(event: str, flow: str) -> None:
    with open(os.environ["LIMIT_LEDGER"], "a", encoding="utf-8") as out:
        out.write(f"{event} {flow} {os.getpid()} {time.time()}\n")


class Reboot(task.Task):
    """Reboots a host, one of a few allowed at once."""

    def execute(self, flow: str) -> None:
        _record("start", flow)
        while not Path(os.environ["LIMIT_GATE"]).exists():
            time.sleep(0.02)  # a file the test writes: nothing to wait on
        _record("end", flow)
