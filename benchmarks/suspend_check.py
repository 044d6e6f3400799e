"""What reading suspend requests costs the serial engine: tasks a second on SQLite.

An engine whose backend other processes can reach reads the flow's ``suspend_requested`` mark
between atom transitions, at most every ``suspend_check_interval`` seconds, and records where it
runs (one flow write per run). This runs the same flows of ``--atoms`` trivial tasks on the
serial engine with a SQLite store, in rounds that alternate the variants (so machine noise hits
each alike), and reports tasks a second for:

- ``off``: no check and no record, as TaskFlow runs (the check is switched off in this script);
- ``default``: the default interval (0.25 s);
- ``every_transition``: interval 0, a read at every transition (the worst case).

Prints one JSON document; progress goes to stderr. Example::

    python benchmarks/suspend_check.py --atoms 1000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowengine import engines, task
from flowengine.engines import suspend_requests as sr
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models


class Step(task.Task):
    def execute(self) -> int:
        return 1


def run_once(backend: Any, atoms: int, options: dict[str, Any]) -> float:
    """Seconds the serial engine takes to run a fresh flow of ``atoms`` tasks."""
    flow = linear_flow.Flow("bench").add(*[Step(f"s{i}") for i in range(atoms)])
    engine = engines.load(flow, backend=backend, book=models.LogBook("bench"), **options)
    engine.compile()
    engine.prepare()
    started = time.perf_counter()
    engine.run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    shared = sr.shared
    variants: dict[str, tuple[Callable[[Any], bool], dict[str, Any]]] = {
        "off": (lambda _backend: False, {}),
        "default": (shared, {}),
        "every_transition": (shared, {"suspend_check_interval": 0}),
    }
    took: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        with backends.backend(f"sqlite:///{Path(tmp) / 'flows.db'}") as backend:
            run_once(backend, 10, {})  # warm up: imports, the schema, the first connection
            for number in range(options.rounds):
                print(f"round {number + 1} of {options.rounds}", file=sys.stderr, flush=True)
                for name, (check, engine_options) in variants.items():
                    sr.shared = check  # type: ignore[assignment]
                    try:
                        took[name].append(run_once(backend, options.atoms, engine_options))
                    finally:
                        sr.shared = shared  # type: ignore[assignment]
    rates = {name: {"best_tasks_per_s": round(options.atoms / min(times)),
                    "median_tasks_per_s": round(options.atoms / statistics.median(times))}
             for name, times in took.items()}
    base = rates["off"]["median_tasks_per_s"]
    print(json.dumps({
        "benchmark": "suspend_check", "python": platform.python_version(),
        "atoms": options.atoms, "rounds": options.rounds, "serial_sqlite": rates,
        "ratio_to_off": {name: round(rate["median_tasks_per_s"] / base, 3)
                         for name, rate in rates.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
