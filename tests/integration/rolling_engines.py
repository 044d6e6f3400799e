"""Engines of one code version running flows on workers: ``rolling_engines.py URL EXCHANGE
TOPIC LABEL FLOWS AT_ONCE`` (the version is ``$ROLLING_VERSION``, as for the workers).

Runs FLOWS flows of :mod:`rolling_tasks`, AT_ONCE at a time on threads, each with its own
worker-based engine; prints ``ok`` and exits 0 if every one succeeded, else prints each failure
and exits 1.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys

import rolling_tasks

from flowengine import engines


def main() -> None:
    url, exchange, topic, label, flows, at_once = sys.argv[1:7]

    def run(index: int) -> None:
        name = f"{label}-{index}"
        engines.run(rolling_tasks.make_flow(name), engine="worker-based", url=url,
                    exchange=exchange, topics=[topic], transition_timeout=120,
                    store={"flow": name, "asked": rolling_tasks.VERSION[0]})

    failures = []
    with cf.ThreadPoolExecutor(max_workers=int(at_once)) as pool:
        for index, future in enumerate([pool.submit(run, i) for i in range(int(flows))]):
            try:
                future.result()
            except Exception as err:  # noqa: BLE001 - reported, then the exit code says it
                failures.append(f"{label}-{index}: {type(err).__name__}: {err}")
    if failures:
        print("\n".join(failures), flush=True)
        raise SystemExit(1)
    print("ok", flush=True)


if __name__ == "__main__":
    main()
