"""Async tasks on a worker: a hundred awaited at once by ONE worker process with ONE thread.

``FetchPage`` is ``async def execute`` (it awaits half a second, as an HTTP call would). The
worker (``--threads 1``) awaits all hundred on its event loop at once, so the flow takes about
half a second, not fifty. Then ``CallHangingService`` waits on a service that never answers:
its ``time_limit`` (1 s) cancels the coroutine on the worker, which hangs up on the service
(its cleanup takes a few awaits), then the atom fails with ``TaskTimeLimitExceeded`` and the
async revert of ``Reserve``, which ran before it, undoes it: the engine waits for the
cleanup's end before it reverts, and the worker's output shows the two in that order.

Run: python examples/wbe_async.py
"""

from __future__ import annotations

import os
import time

import wbe_tasks
from worker_processes import listening_executor, report_exit, worker_processes

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow, unordered_flow

EXCHANGE = "wbe-async"
TOPIC = "io"
PAGES = 100


def main() -> None:
    with listening_executor(EXCHANGE, TOPIC, "flowengine-async-") as (executor, folder):
        with worker_processes(
            ["worker-1"], executor, EXCHANGE, TOPIC, ["wbe_tasks"], folder, threads=1,
            on_exit=report_exit,
        ) as (worker,):  # fmt: skip
            print(f"engine pid {os.getpid()}; one worker, pid {worker.process.pid}, one thread")
            fetches = [wbe_tasks.FetchPage(f"page-{i}", inject={"page": i}, provides=f"p{i}")
                       for i in range(PAGES)]
            engine = engines.load(unordered_flow.Flow("crawl").add(*fetches),
                                  engine="worker-based", executor=executor)
            started = time.perf_counter()
            engine.run()
            took = time.perf_counter() - started
            pids = {engine.storage.fetch(f"p{i}")["worker_pid"] for i in range(PAGES)}
            print(f"{PAGES} pages of 0.5 s each fetched in {took:.1f} s (one after the other: "
                  f"{PAGES * 0.5:.0f} s), all in pid {','.join(map(str, pids))}")

            flow = linear_flow.Flow("book").add(wbe_tasks.Reserve("reserve"),
                                                wbe_tasks.CallHangingService("call"))
            engine = engines.load(flow, engine="worker-based", executor=executor)
            try:
                engine.run()
            except exc.WrappedFailure as wrapped:
                print(f"the hanging call failed: {list(wrapped)[0].exception_str}")
            except exc.TaskTimeLimitExceeded as err:
                print(f"the hanging call failed: {err}")
            print(f"reserve: {engine.storage.get_atom_state('reserve')}, revert result "
                  f"{engine.storage.get_revert_result('reserve')!r}")
            # The worker's own output, in its order: the engine waited for the cancelled
            # call's cleanup (its reply comes after it) before it sent the revert.
            for line in worker.log.read_text(errors="replace").splitlines():
                if line.startswith(("call:", "reserve:")):
                    print(f"worker: {line}")
            print(f"flow state: {engine.storage.get_flow_state()}")
            assert engine.storage.get_flow_state() == states.REVERTED


if __name__ == "__main__":
    main()
