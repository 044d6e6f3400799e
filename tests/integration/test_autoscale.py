"""``flowengine worker --autoscale MAX,MIN``: a backlog grows a real worker's pool.

The worker starts with one task thread and a prefetch of two; four requests that block until
their gate opens can only all run at once if the pool grew to four and the prefetch followed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fault_support import Stage
from wbe_harness import Broker, ProtocolClient, WorkerFleet, request_body

from flowengine.worker_based import protocol as pr

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


def test_a_backlog_grows_the_pool_up_to_max(
    redis_broker: Broker, exchange: str, fleet_factory: Callable[..., WorkerFleet],
    stage: Stage,
) -> None:  # fmt: skip
    fleet = fleet_factory(redis_broker, exchange, env=stage.env)
    [worker] = fleet.start("scaled", ["fault_tasks"], threads=None,
                           extra_args=["--autoscale", "4,1"])
    client = ProtocolClient(redis_broker.url, exchange)
    try:
        ids = [client.publish("scaled", request_body("fault_tasks.Gate", f"g{n}"))
               for n in range(5)]
        for cid in ids[:4]:  # MAX at once: the pool grew from MIN
            client.wait_for(lambda m, cid=cid: m.correlation_id == cid and m.state == pr.RUNNING,
                            TIMEOUT, f"request {cid} running")
        client.drain(0.5)  # the fifth waits: MAX threads, and MAX prefetched
        assert not any(m.state == pr.RUNNING for m in client.replies_to(ids[4]))
        for n in range(5):
            stage.gates.open(f"g{n}")
        assert all(client.outcome(cid, TIMEOUT).state == pr.SUCCESS for cid in ids)
        assert worker.alive
    finally:
        client.close()
