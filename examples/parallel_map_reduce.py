"""Map/reduce on the parallel engine: independent tasks run at once on a thread pool.

An unordered flow fans out one task per chunk of numbers (each sums the squares of its chunk);
a ``ReduceFunctorTask`` then adds the partial sums up. ``MapFunctorTask`` shows the other
shape: one task applying a function to several stored values.

Run: python examples/parallel_map_reduce.py
"""

import operator
import threading
import time

from flowengine import engines, task
from flowengine.flows import linear_flow, unordered_flow

CHUNKS = [list(range(start, start + 25)) for start in range(0, 100, 25)]


class SquareSum(task.Task):
    """Sums the squares of one chunk; tracks how many of these run at the same time."""

    running = 0
    most_at_once = 0
    lock = threading.Lock()

    def execute(self, numbers: list[int]) -> int:
        with SquareSum.lock:
            SquareSum.running += 1
            SquareSum.most_at_once = max(SquareSum.most_at_once, SquareSum.running)
        time.sleep(0.1)  # stands in for real work (I/O, a remote call)
        with SquareSum.lock:
            SquareSum.running -= 1
        return sum(n * n for n in numbers)


def build_flow() -> linear_flow.Flow:
    fan_out = unordered_flow.Flow("map")
    partials = []
    for index in range(len(CHUNKS)):
        name = f"partial_{index}"
        # Each task reads its own chunk: ``rebind`` maps its ``numbers`` argument to chunk_<i>.
        fan_out.add(SquareSum(name=f"square_sum_{index}", provides=name,
                              rebind={"numbers": f"chunk_{index}"}))
        partials.append(name)
    total = task.ReduceFunctorTask(operator.add, requires=partials, name="reduce",
                                   provides="total")
    halves = task.MapFunctorTask(lambda value: value // 2, requires=partials, name="halve",
                                 provides="halves")
    return linear_flow.Flow("map-reduce").add(fan_out, total, halves)


def main() -> None:
    store = {f"chunk_{index}": chunk for index, chunk in enumerate(CHUNKS)}
    engine = engines.load(build_flow(), store=store, engine="parallel", max_workers=4)
    engine.run()
    total = engine.storage.fetch("total")
    print(f"partial sums: {[engine.storage.fetch(f'partial_{i}') for i in range(len(CHUNKS))]}")
    print(f"halves: {engine.storage.fetch('halves')}")
    print(f"total: {total} (expected {sum(n * n for n in range(100))})")
    print(f"most tasks running at once: {SquareSum.most_at_once}")


if __name__ == "__main__":
    main()
