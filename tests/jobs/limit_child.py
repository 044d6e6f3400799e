"""A process running flows whose tasks share a concurrency limit:
``limit_child.py CONF LEDGER LABEL FLOWS LIMIT``.

Runs FLOWS flows at once (one engine each, on threads), each one ``RebootHost`` task limited to
LIMIT at once across every process using CONF, and writes each task's start and end to the
ledger (``lock_flows``'s format).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from flowengine import engines, task
from flowengine.flows import linear_flow

from lock_flows import _record  # isort: skip  (the tests' folder is on the path)


class RebootHost(task.Task):
    """Records its start, works a moment, records its end."""

    def execute(self, ledger: str, job: str) -> None:
        _record(ledger, "start", job, self.name)
        threading.Event().wait(0.3)
        _record(ledger, "end", job, self.name)


def main() -> None:
    conf, ledger, label, flows, limit = sys.argv[1:6]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        flow: Any = linear_flow.Flow(f"{label}-{index}").add(RebootHost("reboot"))
        try:
            engines.run(flow, store={"ledger": ledger, "job": f"{label}-{index}"},
                        coordination=conf, concurrency={"RebootHost": int(limit)})
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(int(flows))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise SystemExit(f"{len(errors)} flows failed: {errors[0]!r}")


if __name__ == "__main__":
    main()
