"""Routing by task class on real ``flowengine worker`` processes (Redis).

A class no live worker runs fails fast, within ``unserved_timeout`` rather than the minute-long
``transition_timeout``, with an error naming the class, the topic and what is served there; its
completed work is reverted. With no worker on the topic at all, the ordinary transition timeout
applies, and its error says that no worker was known.

A rolling deploy: two workers on one topic run different task lists. Both share the topic's
queue, so a request can reach the worker that does not run its class; that worker hands it back
and the engine sends it again, uncounted, until the worker that runs the class has it. Every
execute and revert runs, and ``max_attempts=1`` shows that no hand-back counted as an attempt.
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

TOPIC = "partial"
#: Far longer than the fail-fast wait: reaching it would mean the fast path did not work.
TRANSITION_TIMEOUT = 60.0
UNSERVED_TIMEOUT = 1.0
ADDS = 6


@pytest.fixture
def ledger(tmp_path: Path) -> tasks.FileLedger:
    """What the workers' tasks did."""
    return tasks.FileLedger(tmp_path / "ledger.jsonl")


@pytest.fixture
def fleet(redis_broker: Broker, exchange: str, fleet_factory: Any,
          ledger: tasks.FileLedger) -> WorkerFleet:
    """Workers on Redis writing to ``ledger`` (none started yet)."""
    fleet: WorkerFleet = fleet_factory(redis_broker, exchange,
                                       env={tasks.LEDGER_ENV: str(ledger.path)})
    return fleet


def test_a_class_no_worker_runs_fails_fast_naming_what_is_served(
    fleet: WorkerFleet, ledger: tasks.FileLedger,
) -> None:  # fmt: skip
    fleet.start(TOPIC, [f"{tasks.__name__}:Constant"], threads=2)
    flow = lf.Flow("needs-add").add(
        tasks.Constant("one", provides="x", inject={"value": 1}),
        tasks.Add("sum", rebind={"y": "x"}, provides="total"))
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPIC, transition_timeout=TRANSITION_TIMEOUT, unserved_timeout=UNSERVED_TIMEOUT))

    # A NotFound, not the RequestTimeout the 60 s transition timeout would raise: the
    # fail-fast path acted.
    with pytest.raises(exc.NotFound) as raised:
        engine.run()

    message = str(raised.value)
    assert "'behaviour.tasks.Add'" in message, message
    assert f"topic(s) '{TOPIC}'" in message, message
    assert f"on topic '{TOPIC}' run: behaviour.tasks.Constant" in message, message
    # The work that did run was undone, on the worker that runs its class.
    assert [(e["event"], e["atom"]) for e in ledger.entries()] == [
        ("execute", "one"), ("revert", "one")]


def test_with_no_worker_known_the_transition_timeout_applies_and_says_so(
    fleet: WorkerFleet,  # no worker started
) -> None:  # fmt: skip
    flow = lf.Flow("nobody").add(tasks.Constant("one", inject={"value": 1}))
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        "empty", transition_timeout=2.0, unserved_timeout=UNSERVED_TIMEOUT))

    with pytest.raises(exc.RequestTimeout, match="no worker was known on topic.s. 'empty'"):
        engine.run()


def test_a_mixed_fleet_runs_every_execute_and_revert_on_a_worker_that_serves_it(
    fleet: WorkerFleet, ledger: tasks.FileLedger,
) -> None:  # fmt: skip
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
