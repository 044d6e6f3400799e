"""How jobs end, a damaged posting, and a job the board lost: nothing vanishes.

The script posts three jobs to a Redis jobboard (one succeeds, one is reverted, one cannot start
because an input is missing) and runs them on a conductor that deletes the logbooks of jobs
that succeeded (``delete_logbook=True``). The other two keep their logbooks, with how they
ended and why, which it prints. A hostile writer then leaves a value that is not a job on the
board: the conductor skips it and moves it to the trash. Last, a job is deleted from Redis
behind everyone's back (as a Redis restarted without its data would lose it): its flow is
reported as orphaned, its job is posted again, and the conductor runs it.

Needs Redis (FLOWENGINE_REDIS_URL, default redis://127.0.0.1:6379/0).
Run: python examples/jobs_endings.py
"""

import contextlib
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

from flowengine import task
from flowengine.conductors import backends as conductors
from flowengine.flows import linear_flow
from flowengine.jobs import backends, endings, orphans
from flowengine.jobs.posting import post_flow
from flowengine.persistence import backends as persistence_backends

REDIS_URL = os.environ.get("FLOWENGINE_REDIS_URL", "redis://127.0.0.1:6379/0")


class Provision(task.Task):
    def execute(self) -> str:
        return "provisioned"


class Charge(task.Task):
    def execute(self) -> None:
        raise RuntimeError("card declined")


class Resize(task.Task):
    def execute(self, volume_size: int) -> int:
        return volume_size


def provision() -> linear_flow.Flow:
    return linear_flow.Flow("provision").add(Provision("provision"))


def charge() -> linear_flow.Flow:
    return linear_flow.Flow("charge").add(Provision("reserve"), Charge("charge"))


def resize() -> linear_flow.Flow:
    return linear_flow.Flow("resize").add(Resize("resize"))


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)  # the board and the store change in the conductor's thread


def main() -> None:
    namespace = f"endings-{uuid.uuid4().hex[:8]}"
    conf = {"board": REDIS_URL, "namespace": namespace, "claim_ttl": 3}
    client = redis.Redis.from_url(REDIS_URL)
    with contextlib.ExitStack() as stack:
        db = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="endings-"))) / "flows.db"
        stack.callback(lambda: client.delete(*client.keys(f"{namespace}:*") or ["-"]))
        store = stack.enter_context(persistence_backends.backend(f"sqlite:///{db}"))
        board = stack.enter_context(backends.backend("example", conf, persistence=store))
        conductor = conductors.fetch("blocking", "example-conductor", board, persistence=store,
                                     delete_logbook=True)
        runner = threading.Thread(target=conductor.run, daemon=True)
        runner.start()
        stack.callback(runner.join, 30)
        stack.callback(conductor.stop)

        jobs = [post_flow(board, store, factory) for factory in (provision, charge, resize)]
        wait_until(lambda: not list(board.iterjobs(ensure_fresh=True)), 60, "the three jobs")
        wait_until(lambda: len(endings.find_endings(store, board)) == 2, 30, "their endings")
        for ending in reversed(endings.find_endings(store, board)):
            print(f"{ending.job_name}: {ending.outcome} ({ending.reason.splitlines()[0]})")
        kept = {book.name for book in store.get_connection().get_logbooks(lazy=True)}
        print(f"logbooks kept: {', '.join(sorted(kept))} (provision succeeded: deleted)")

        client.hset(f"{namespace}:jobs", "not-a-job", b"\x00 garbage")
        late = post_flow(board, store, provision, name="after-the-garbage")
        late.wait(timeout=60)
        [damaged] = board.iter_damaged() or [None]
        print(f"damaged posting at {damaged.key}: {damaged.reason}; moved to the trash: "
              f"{damaged.trashed}")
        print(f"the job posted after it ran: {jobs[0].state == late.state == 'COMPLETE'}")

        conductor.stop()  # lose a job while no conductor runs: Redis forgets it
        runner.join(30)
        lost = post_flow(board, store, provision, name="nightly")
        client.hdel(f"{namespace}:jobs", lost.uuid)
        found = orphans.find_orphans(board, store)
        print("orphaned: " + ", ".join(f"{o.flow_name} ({o.state or 'PENDING'})" for o in found))
        again = orphans.repost(board, store, found[0])
        runner = threading.Thread(target=conductor.run, daemon=True)
        runner.start()
        stack.callback(runner.join, 30)
        stack.callback(conductor.stop)
        again.wait(timeout=60)
        print(f"re-posted as {again.name}; orphaned now: {len(orphans.find_orphans(board, store))}")


if __name__ == "__main__":
    main()
