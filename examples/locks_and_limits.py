"""Per-resource locks and a concurrency limit, held on Redis by every engine that asks.

Two flows act on the same load balancer, an update and a delete; each is loaded with
``locks=["lb:1234"]``, so however they are started (here at once, on two threads; in a service,
in any process using the same Redis) one runs entirely before the other: their steps never
interleave. Then ten flows each reboot a host with ``concurrency={"RebootHost": 3}``: at most
three ``RebootHost`` tasks run at once across all of them, and the others wait, PENDING (not
RUNNING), until a slot frees. Locks and limits are leases on the service: a process that dies
holding one loses it when its lease ends.

Needs Redis (FLOWENGINE_REDIS_URL, default redis://127.0.0.1:6379/0).
Run: python examples/locks_and_limits.py
"""

import os
import threading
import time
import uuid

from flowengine import coordination, engines, task
from flowengine.flows import linear_flow

REDIS_URL = os.environ.get("FLOWENGINE_REDIS_URL", "redis://127.0.0.1:6379/0")
#: Locks live in the jobboard's namespace: one of this run's own, so runs do not meet.
NAMESPACE = f"example-{uuid.uuid4().hex[:8]}"
COORDINATION = f"{REDIS_URL}?namespace={NAMESPACE}"

steps: list[str] = []
running: list[str] = []
most_at_once = [0]
guard = threading.Lock()


class BalancerStep(task.Task):
    """One step of an operation on the load balancer."""

    def execute(self, lb: str) -> None:
        steps.append(f"{self.name} {lb}")
        time.sleep(0.1)  # talking to the load balancer's API


class RebootHost(task.Task):
    """Reboots one host (the hypervisor takes at most three at once)."""

    def execute(self, host: str) -> None:
        with guard:
            running.append(host)
            most_at_once[0] = max(most_at_once[0], len(running))
        time.sleep(0.2)
        with guard:
            running.remove(host)


def balancer_flow(operation: str) -> linear_flow.Flow:
    return linear_flow.Flow(f"{operation}-lb").add(
        *(BalancerStep(f"{operation}-{n}") for n in ("drain", "apply", "check")))


def run_all(loaded: list) -> None:
    threads = [threading.Thread(target=engine.run) for engine in loaded]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> None:
    lb = {"lb": "lb:1234"}
    run_all([engines.load(balancer_flow(op), store=lb, locks=["lb:1234"],
                          coordination=COORDINATION) for op in ("update", "delete")])
    first = steps[0].split("-")[0]
    in_order = [s.split("-")[0] for s in steps] == [first] * 3 + [
        "delete" if first == "update" else "update"] * 3
    print(f"steps: {', '.join(s.split()[0] for s in steps)}")
    print(f"update-lb and delete-lb ran one after the other: {in_order}")

    reboots = [engines.load(linear_flow.Flow(f"reboot-{i}").add(RebootHost("reboot")),
                            store={"host": f"host-{i}"}, concurrency={"RebootHost": 3},
                            coordination=COORDINATION) for i in range(10)]
    run_all(reboots)
    print(f"10 reboots done, most at once: {most_at_once[0]} (limit 3)")
    coordination.shared(COORDINATION).close()
    forget(NAMESPACE)


def forget(namespace: str) -> None:
    """Delete what this run left on Redis (the counter its queues number entries by)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{namespace}:*"):
        client.delete(key)
    client.close()


if __name__ == "__main__":
    main()
