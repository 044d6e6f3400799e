"""Task classes for the worker-based examples (wbe_linear.py, wbe_fanout.py, wbe_progress.py,
wbe_async.py, wbe_cells.py, wbe_frozen_worker.py).

Remote tasks live in an importable module because a worker runs only the classes it was started
with, looks them up by their ``module.ClassName`` and builds them as ``cls(name=...)``: inputs
travel as JSON arguments, never as constructor parameters. Results must be JSON values too.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any

from worker_processes import WORKER_NAME_ENV

from flowengine import task

# -- wbe_linear.py: an order, one step after the other ---------------------------------------


class ReserveStock(task.Task):
    default_provides = "reservation"

    def execute(self, item: str, quantity: int) -> str:
        print(f"reserve_stock: reserving {quantity} x {item}")
        return f"rsv-{item}-{quantity}"


class ChargeCard(task.Task):
    default_provides = "payment"

    def execute(self, reservation: str, quantity: int, unit_price: float) -> dict[str, object]:
        amount = round(quantity * unit_price, 2)
        print(f"charge_card: charging {amount:.2f} for {reservation}")
        return {"amount": amount, "receipt": f"rcpt-{reservation}"}


class ShipOrder(task.Task):
    default_provides = "tracking"

    def execute(self, reservation: str, payment: dict[str, object]) -> str:
        print(f"ship_order: shipping {reservation} (paid, {payment['receipt']})")
        return f"trk-{reservation}"


# -- wbe_fanout.py: count primes in chunks, on whichever worker is free ----------------------


def _is_prime(number: int) -> bool:
    if number < 2:
        return False
    return all(number % d for d in range(2, math.isqrt(number) + 1))


class CountPrimes(task.Task):
    """Counts the primes in ``[start, stop)``; says which worker process did it."""

    def execute(self, start: int, stop: int) -> dict[str, object]:
        began = time.perf_counter()
        count = sum(1 for n in range(start, stop) if _is_prime(n))
        return {
            "count": count,
            "worker": os.environ.get(WORKER_NAME_ENV, f"pid {os.getpid()}"),
            "seconds": round(time.perf_counter() - began, 3),
        }


# -- wbe_cells.py: work that must stay in its cell ------------------------------------------


class ProvisionVolume(task.Task):
    """Stands in for creating a volume on the storage of the cell the worker runs in."""

    def execute(self, volume: str) -> str:
        return f"{volume} provisioned"


# -- wbe_progress.py: a long task reporting its progress from the worker ---------------------


class CopyFile(task.Task):
    """Copies ``size_mb`` megabytes in ``chunks`` steps, reporting progress after each."""

    default_provides = "copied"

    def execute(self, size_mb: int, chunks: int) -> dict[str, int]:
        for done in range(1, chunks + 1):
            time.sleep(0.05)  # stands in for the chunk's I/O
            if done < chunks:
                self.update_progress(done / chunks)
        return {"megabytes": size_mb, "worker_pid": os.getpid()}


# -- wbe_async.py: async tasks, awaited by the hundred on one worker --------------------------


class FetchPage(task.Task):
    """Stands in for an HTTP call: awaits half a second, then says which process it ran in."""

    async def execute(self, page: int) -> dict[str, int]:
        await asyncio.sleep(0.5)  # an async HTTP client's await would be here
        return {"page": page, "worker_pid": os.getpid()}


class Reserve(task.Task):
    """Reserves a slot; its revert releases it (both async)."""

    async def execute(self) -> str:
        await asyncio.sleep(0)
        return "slot-7"

    async def revert(self, result: Any, **kwargs: Any) -> str:
        await asyncio.sleep(0)
        print(f"reserve: released {result}", flush=True)
        return f"released {result}"


class CallHangingService(task.Task):
    """Waits on a service that never answers: its time limit cancels it, and it hangs up."""

    time_limit = 1.0

    async def execute(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # hanging up takes a round trip to the service
            print("call: cancelled by its time limit; hung up", flush=True)
            raise


# -- wbe_frozen_worker.py: a worker frozen while it runs a task ------------------------------


class HoldOnA(task.Task):
    """Says it started (a file named after its worker), then returns at once, except on worker
    ``a``: there it waits for the ``release`` file, and the example freezes that worker
    meanwhile."""

    def execute(self, signal_folder: str) -> str:
        me = os.environ.get(WORKER_NAME_ENV, "?")
        with open(os.path.join(signal_folder, f"started-{me}"), "w"):
            pass
        while me == "a" and not os.path.exists(os.path.join(signal_folder, "release")):
            time.sleep(0.05)  # a file the example writes: nothing to wait on
        return me


class WhereAmI(task.Task):
    """Says which worker ran it."""

    def execute(self) -> str:
        return os.environ.get(WORKER_NAME_ENV, "?")
