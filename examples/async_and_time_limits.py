"""Async tasks and time limits on the local engines.

Part 1 checks fifty "hosts" with an ``async def execute`` on the parallel engine: they are
awaited together on one event loop thread (two pool threads would take 25 rounds otherwise).
Part 2 gives a task that hangs a time limit: the atom fails with TaskTimeLimitExceeded, the
coroutine is cancelled, and the completed step is reverted.

Run: python examples/async_and_time_limits.py
"""

import asyncio
import time

from flowengine import engines, exceptions, task
from flowengine.flows import linear_flow, unordered_flow


class CheckHost(task.Task):
    """Pretends to ask a host for its health over the network (0.2 s of waiting)."""

    async def execute(self) -> str:
        await asyncio.sleep(0.2)
        return f"{self.name} ok"


class Reserve(task.Task):
    def execute(self) -> str:
        print("reserve: reserved an address")
        return "10.0.0.7"

    def revert(self, result: str, **kwargs: object) -> None:
        print(f"reserve: released {result}")


class Hangs(task.Task):
    """Waits for an answer that never comes; its time limit stops it."""

    time_limit = 0.5

    async def execute(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            print("wait_for_boot: cancelled by its time limit")
            raise


def main() -> None:
    hosts = unordered_flow.Flow("health").add(
        *(CheckHost(f"host-{i:02d}", provides=f"host-{i:02d}") for i in range(50)))
    started = time.monotonic()
    engine = engines.load(hosts, engine="parallel", max_workers=2)
    engine.run()
    elapsed = time.monotonic() - started
    healthy = [value for value in engine.storage.fetch_all().values() if value.endswith(" ok")]
    print(f"healthy hosts: {len(healthy)} of 50")
    print(f"took {elapsed:.1f}s on 2 pool threads (one after the other: 10s)")

    boot = linear_flow.Flow("boot").add(Reserve("reserve"), Hangs("wait_for_boot"))
    try:
        engines.run(boot, engine="serial")
    except exceptions.TaskTimeLimitExceeded as err:
        print(f"run raised TaskTimeLimitExceeded: {str(err).split(' (ran')[0]}")


if __name__ == "__main__":
    main()
