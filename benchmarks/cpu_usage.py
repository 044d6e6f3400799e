"""CPU time of the processes a benchmark involves, so results say where the machine's time went.

Linux only (``/proc/<pid>/stat``); elsewhere every reading is ``None`` and the reports leave the
CPU fields out. A broker server is found by its process name (``redis-server``, RabbitMQ's
``beam.smp``); ``fs`` has no server: its work is done inside the engine and worker processes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping

#: The process name of each broker's server.
BROKER_PROCESS = {"redis": "redis-server", "rabbitmq": "beam.smp", "beanstalk": "beanstalkd"}


def process_seconds(pid: int) -> float | None:
    """User plus system CPU seconds ``pid`` has used so far; None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            # The command name (field 2) may hold spaces: fields are counted after its ')'.
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid(broker_name: str) -> int | None:
    """The pid of the local server of ``broker_name``, if exactly one runs."""
    name = BROKER_PROCESS.get(broker_name)
    if name is None:
        return None
    try:
        found = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=False)
    except OSError:
        return None
    pids = found.stdout.split()
    return int(pids[0]) if len(pids) == 1 else None


def with_broker(groups: Mapping[str, list[int]], broker_name: str) -> dict[str, list[int]]:
    """``groups`` plus ``broker``, the local server of ``broker_name``, when it can be found."""
    server = broker_pid(broker_name)
    return {**groups, "broker": [server]} if server is not None else dict(groups)


def snapshot(groups: Mapping[str, Iterable[int]]) -> dict[str, float | None]:
    """CPU seconds per group of pids (None if any pid of the group cannot be read)."""
    totals: dict[str, float | None] = {}
    for group, pids in groups.items():
        readings = [process_seconds(pid) for pid in pids]
        totals[group] = None if not readings or None in readings else sum(readings)  # type: ignore[arg-type]
    return totals


def per_unit_ms(before: Mapping[str, float | None], after: Mapping[str, float | None],
                units: int) -> dict[str, float]:
    """Milliseconds of CPU per unit of work for each group both snapshots could read, and their
    ``total``.

    ``/proc`` counts in clock ticks (usually 10 ms), so a run needs thousands of units for a
    figure to two decimals.
    """
    spent = {
        group: round(1000 * (after[group] - start) / units, 4)  # type: ignore[operator]
        for group, start in before.items()
        if start is not None and after.get(group) is not None and units
    }
    if spent:
        spent["total"] = round(sum(spent.values()), 4)
    return spent
