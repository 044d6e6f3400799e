"""Engine SIGKILLed while its requests wait in a worker queue, then resumed (issue 14, item 7).

A flow of two gated tasks runs on one worker with one thread: one task runs (blocked on its
gate), the other's request waits in the topic queue. The engine process is killed with SIGKILL,
and a new engine resumes the flow from the SQLite file. The dead engine's first attempt ids were
stored with the atoms' RUNNING state; the resumed engine asks the workers to drop them, so the
request that waited is settled unrun when the worker reaches it, and the resumed engine's own
request runs it: the task that never started before the crash starts exactly once. The task in
flight at the crash may run again (the crash window every engine has).

A retried task whose attempt waits at beanstalkd as a delayed job when the engine dies is
covered too: the resumed engine deletes the job by its stored handle, or, if the engine died
before storing it, the worker drops it unrun when its delay ends (the CANCEL of its id).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fault_tasks as ft
import pytest
import resume_child
from fault_support import WAIT, EngineRuns, Stage, wait_until
from wbe_harness import Broker, WorkerFleet

from flowengine import engines, states
from flowengine.engines.actions import META_ATTEMPT_IDS
from flowengine.persistence import backends, models

pytestmark = pytest.mark.integration

TOPIC = "resume-revokes"


@contextlib.contextmanager
def _engine_child(broker: Broker, fleet: WorkerFleet, stage: Stage, tmp_path: Path,
                  factory: str = "make_flow",
                  ) -> Iterator[tuple[Any, dict[str, Any], Any, Any, Any]]:
    """A one-thread worker, and an engine process running a new flow of ``resume_child``
    (``factory``: which flow); yields the worker, the engine options, the backend, its
    connection and the engine process."""
    (worker,) = fleet.start(TOPIC, [ft.__name__], threads=1)
    options = fleet.engine_options(TOPIC)
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
        book = models.LogBook(f"resume-{broker.name}")
        conn.save_logbook(book)
        child = resume_child.start(uri, book.uuid, options, tmp_path / "engine.err", stage.env,
                                   factory)
        yield worker, options, backend, conn, child


def test_requests_queued_at_an_engine_crash_do_not_run_after_resume(
    redis_broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    tmp_path: Path,
) -> None:
    fleet: WorkerFleet = fleet_factory(redis_broker, exchange, env=stage.env)
    with _engine_child(redis_broker, fleet, stage, tmp_path) as (worker, options, backend,
                                                                 conn, child):
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


@pytest.mark.parametrize("handle_stored", [True, False], ids=["deleted", "revoked"])
def test_a_delayed_request_left_by_a_crashed_engine_does_not_run_after_resume(
    handle_stored: bool, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    tmp_path: Path,
) -> None:  # fmt: skip
    # An engine SIGKILLed while attempt 2 of a retried task waits at beanstalkd as a delayed
    # job. deleted: the resumed engine deletes that job (its handle was stored with the task)
    # before it sends attempt 2 again. revoked: the engine died between the put and storing the
    # handle (the handle is removed here), so the job stays; the resumed engine's CANCEL of
    # the old attempt id makes the worker that reserves it when its delay ends drop it unrun.
    import greenstalk
    from wbe_harness import require_broker

    from flowengine.engines.actions import META_DELAYED_JOB
    from flowengine.worker_based.broker import transport_beanstalk_delays as beanstalk_delays

    broker = require_broker("beanstalk")
    fleet: WorkerFleet = fleet_factory(broker, exchange, env=stage.env)
    with _engine_child(broker, fleet, stage, tmp_path, "make_delayed_flow") as (
            worker, options, backend, conn, child):
        try:
            assert child.stdout is not None
            flow_uuid = child.stdout.readline().split()[-1]

            def stored_job() -> str | None:
                flaky = {ad.name: ad for ad in conn.get_flow_details(flow_uuid)}.get("flaky")
                job = flaky.meta.get(META_DELAYED_JOB) if flaky is not None else None
                return job if flaky is not None and flaky.state == states.RUNNING else None

            old = wait_until(stored_job, WAIT, "attempt 2 put as a delayed job",
                             details=(tmp_path / "engine.err").read_text)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        address, old_id = beanstalk_delays.parse(old)
        if not handle_stored:
            flaky = {ad.name: ad for ad in conn.get_flow_details(flow_uuid)}["flaky"]
            flaky.meta[META_DELAYED_JOB] = None
            conn.update_atom_details(flaky)
        with greenstalk.Client(address) as client:
            assert client.stats_job(old_id)["state"] == "delayed"

            engine = engines.load_from_detail(conn.get_flow_details(flow_uuid), backend=backend,
                                              engine="worker-based", **options)
            run = runs.start(engine, "resumed")
            storage = engine.storage

            def new_job() -> str | None:
                job = storage.flow_detail.find(storage.get_atom_uuid("flaky")).meta.get(
                    META_DELAYED_JOB)
                return job if job and job != old else None

            fresh = wait_until(new_job, WAIT, "attempt 2 put again as a delayed job")
            if handle_stored:
                with pytest.raises(greenstalk.NotFoundError):
                    client.stats_job(old_id)  # the dead engine's job is gone
            else:
                client.kick_job(old_id)  # its delay ends now: a worker reserves it
                wait_until(lambda: "its engine revoked it" in worker.log(400), WAIT,
                           "the worker dropping the revoked request", details=worker.log)
            client.kick_job(beanstalk_delays.parse(fresh)[1])
            assert run.join(WAIT, details=stage.ledger.dump) is None

    assert engine.storage.get_flow_state() == states.SUCCESS
    assert [line["attempt"] for line in stage.ledger.starts("flaky")] == [1, 2]
