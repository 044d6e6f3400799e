"""The worker-based engine records which worker ran each task, and on which attempt."""

from __future__ import annotations

import threading
import uuid

from wb_lease_tasks import Slow  # tests/unit is on sys.path (pytest rootdir insertion)

from flowengine import engines
from flowengine.flows import linear_flow as lf
from flowengine.worker_based.worker import Worker


def test_worker_and_attempt_are_stored_in_atom_metadata() -> None:
    exchange = f"placement-{uuid.uuid4().hex[:8]}"
    worker = Worker(exchange=exchange, topic="placed", tasks=[Slow], transport="memory",
                    threads_count=2, events=False)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    assert worker.wait(10)
    try:
        engine = engines.load(lf.Flow("f").add(Slow(name="one"), Slow(name="two")),
                              engine="worker-based", exchange=exchange, topics=["placed"],
                              transport="memory", events=False)
        engine.run()
        meta = {ad.name: ad.meta for ad in engine.storage.flow_detail}
        assert meta["one"]["worker"] == worker.worker_id == meta["two"]["worker"]
        assert meta["one"]["attempts"] == 1
    finally:
        worker.stop()
        thread.join(10)
