"""A rolling deploy: two worker processes on one topic run different task lists.

Both share the topic's queue, so a request can reach the worker that does not run its class.
That worker hands it back, and the engine sends it again, uncounted, until the worker that
runs the class has it: every execute and every revert runs, none fails for want of a worker,
and ``max_attempts=1`` shows that no hand-back counted as an attempt.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from behaviour import tasks
from wbe_harness import Broker, WorkerFleet

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf

pytestmark = pytest.mark.integration

TOPIC = "rolling"
ADDS = 6


def test_a_mixed_fleet_runs_every_execute_and_revert_on_a_worker_that_serves_it(
    redis_broker: Broker, exchange: str, fleet_factory: Any, tmp_path: Path,
) -> None:  # fmt: skip
    ledger = tasks.FileLedger(tmp_path / "ledger.jsonl")
    fleet: WorkerFleet = fleet_factory(redis_broker, exchange,
                                       env={tasks.LEDGER_ENV: str(ledger.path)})
    fleet.start(TOPIC, [tasks.__name__], threads=2)  # the new version: runs everything
    fleet.start(TOPIC, [f"{tasks.__name__}:Constant", f"{tasks.__name__}:Fail"], threads=2)
    flow = lf.Flow("deploy").add(
        tasks.Constant("one", provides="x", inject={"value": 1}),
        uf.Flow("adds").add(*[tasks.Add(f"add-{i}", rebind={"y": "x"}, provides=f"sum-{i}")
                              for i in range(ADDS)]),
        tasks.Fail("boom"))
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPIC, transition_timeout=30.0, max_attempts=1, unserved_timeout=10.0))

    with pytest.raises(exc.WrappedFailure, match="Boom: boom failed"):
        engine.run()

    done = Counter((e["event"], e["atom"]) for e in ledger.entries())
    adds = [f"add-{i}" for i in range(ADDS)]
    assert {atom: done["execute", atom] for atom in adds} == dict.fromkeys(adds, 1), done
    assert {atom: done["revert", atom] for atom in adds} == dict.fromkeys(adds, 1), done
    assert done["revert", "one"] == 1, done

    # Workers log one line per task received and finished, with its duration (as Celery does).
    logged = "".join(w.log(tail=500) for w in fleet.workers)
    assert re.search(r"Task add-0\[[0-9a-f-]+\] received", logged), logged
    assert re.search(r"Task add-0\[[0-9a-f-]+\] succeeded in \d+\.\d{3}s", logged), logged
    assert re.search(r"Task boom\[[0-9a-f-]+\] failed \(behaviour\.tasks\.Boom\) in "
                     r"\d+\.\d{3}s", logged), logged
