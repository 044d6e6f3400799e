"""Engine SIGKILLed while its requests wait in a worker queue, then resumed (issue 14, item 7).

A flow of two gated tasks runs on one worker with one thread: one task runs (blocked on its
gate), the other's request waits in the topic queue. The engine process is killed with SIGKILL,
and a new engine resumes the flow from the SQLite file. The dead engine's first attempt ids were
stored with the atoms' RUNNING state; the resumed engine asks the workers to drop them, so the
request that waited is settled unrun when the worker reaches it, and the resumed engine's own
request runs it: the task that never started before the crash starts exactly once. The task in
flight at the crash may run again (the crash window every engine has).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import fault_tasks as ft
import pytest
import resume_child
from fault_support import WAIT, EngineRuns, Stage, wait_until
from wbe_harness import HERE, Broker, WorkerFleet, subprocess_env

from flowengine import engines, states
from flowengine.engines.actions import META_ATTEMPT_IDS
from flowengine.persistence import backends, models

pytestmark = pytest.mark.integration

TOPIC = "resume-revokes"


def _start_engine(uri: str, book: str, options: dict[str, Any], out: Path,
                  env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "resume_child.py"), uri, book, json.dumps(options)],
        stdout=subprocess.PIPE, stderr=out.open("w"), text=True, env=subprocess_env(env))


def test_requests_queued_at_an_engine_crash_do_not_run_after_resume(
    redis_broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    tmp_path: Path,
) -> None:
    fleet: WorkerFleet = fleet_factory(redis_broker, exchange, env=stage.env)
    (worker,) = fleet.start(TOPIC, [ft.__name__], threads=1)
    options = fleet.engine_options(TOPIC)
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
        book = models.LogBook("resume-revokes")
        conn.save_logbook(book)
        child = _start_engine(uri, book.uuid, options, tmp_path / "engine.err", stage.env)
        try:
            assert child.stdout is not None
            flow_uuid = child.stdout.readline().split()[-1]
            (running,) = wait_until(
                lambda: stage.ledger.events(event=ft.EXECUTE_START), WAIT,
                "a gated task starting on the worker", details=stage.ledger.dump)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        first = running["atom"]
        (queued,) = [name for name in resume_child.GATES if name != first]

        # Both atoms were stored RUNNING with the id of the request sent for them.
        stored = {ad.name: ad for ad in conn.get_flow_details(flow_uuid)}
        assert {stored[name].state for name in resume_child.GATES} == {states.RUNNING}
        assert all(len(stored[name].meta[META_ATTEMPT_IDS]) == 1 for name in resume_child.GATES)

        engine = engines.load_from_detail(conn.get_flow_details(flow_uuid), backend=backend,
                                          engine="worker-based", **options)
        run = runs.start(engine, "resumed")
        # The worker (busy with the first gate) heard which requests not to run.
        wait_until(lambda: "revoked request" in worker.log(400), WAIT,
                   "the worker being told of the revoked requests", details=worker.log)
        stage.gates.open(first)
        stage.gates.open(queued)
        assert run.join(WAIT, details=stage.ledger.dump) is None

    assert engine.storage.get_flow_state() == states.SUCCESS
    assert len(stage.ledger.starts(queued)) == 1, stage.ledger.dump()
    assert len(stage.ledger.ends(queued)) == 1, stage.ledger.dump()
    assert 1 <= len(stage.ledger.starts(first)) <= 2, stage.ledger.dump()
    assert "its engine revoked it" in worker.log(400)
