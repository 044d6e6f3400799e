"""Fan-out: one computation split into chunks, run by three worker processes at once.

Counts the primes below 400,000 in eight chunks. The chunks form an unordered flow, so the engine
sends all eight requests at once; three ``flowengine worker`` processes share the topic's queue and
each holds only as many requests as it has threads (one), so a free worker takes the next chunk.
Each chunk's result says which worker computed it.

Run: python examples/wbe_fanout.py
"""

from __future__ import annotations

import collections
import time

import wbe_tasks
from worker_processes import listening_executor, report_exit, worker_processes

from flowengine import engines
from flowengine.flows import unordered_flow

EXCHANGE = "wbe-fanout"
TOPIC = "primes"
WORKERS = ("worker-1", "worker-2", "worker-3")
LIMIT = 400_000
CHUNKS = 8


def build_flow() -> unordered_flow.Flow:
    size = LIMIT // CHUNKS
    return unordered_flow.Flow("count-primes").add(
        *(
            wbe_tasks.CountPrimes(
                f"chunk-{i}",
                provides=f"chunk_{i}",
                inject={"start": i * size, "stop": (i + 1) * size},
            )
            for i in range(CHUNKS)
        )
    )



def report(engine: engines.ActionEngine, elapsed: float) -> None:
    """Print which worker computed each chunk, and the total."""
    results = [engine.storage.fetch(f"chunk_{i}") for i in range(CHUNKS)]
    size = LIMIT // CHUNKS
    print(f"{'chunk':<8} {'numbers':<17} {'primes':>6}  {'worker':<9} {'took':>6}")
    for i, result in enumerate(results):
        span = f"{i * size}-{(i + 1) * size - 1}"
        print(
            f"chunk-{i:<2} {span:<17} {result['count']:>6}  {result['worker']:<9}"
            f" {result['seconds']:>5.2f}s"
        )
    per_worker = collections.Counter(result["worker"] for result in results)
    for name in sorted(per_worker):
        print(f"{name} ran {per_worker[name]} chunk(s)")
    busy = sum(result["seconds"] for result in results)
    print(f"workers used: {len(per_worker)}")
    print(f"the chunks took {busy:.2f}s added up; side by side the flow took {elapsed:.2f}s")
    print(f"total: {sum(result['count'] for result in results)} primes below {LIMIT:,}")


def main() -> None:
    with listening_executor(EXCHANGE, TOPIC, "flowengine-fanout-") as (executor, data_folder):
        with worker_processes(
            WORKERS, executor, EXCHANGE, TOPIC, ["wbe_tasks:CountPrimes"], data_folder,
            threads=1, on_exit=report_exit,
        ):  # fmt: skip
            print(f"{len(WORKERS)} workers are up on topic '{TOPIC}'")
            engine = engines.load(build_flow(), engine="worker-based", executor=executor)
            started = time.perf_counter()
            engine.run()
            report(engine, time.perf_counter() - started)


if __name__ == "__main__":
    main()
