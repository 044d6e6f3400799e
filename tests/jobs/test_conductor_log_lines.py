"""A conductor's log lines name a job by its name and uuid, never by its whole details.

``str(job)`` (TaskFlow's) holds every detail of the job, its store included: a line per claim,
completion or failure would repeat a large store in every log line, and its values with it.
"""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
from boards import make_redis_board, wipe_redis

from flowengine import task
from flowengine.conductors.backends.impl_blocking import BlockingConductor
from flowengine.flows import linear_flow
from flowengine.jobs.posting import post_flow
from flowengine.persistence import backends as persistence_backends

pytestmark = pytest.mark.integration

STORED = "a-long-stored-value-" * 20


class Echo(task.Task):
    def execute(self, payload: str) -> int:
        return len(payload)


def echo_flow() -> linear_flow.Flow:
    """The job's flow factory (imported back by name by the conductor)."""
    return linear_flow.Flow("echo").add(Echo())


def test_conductor_log_lines_name_the_job_not_its_store(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    namespace = f"loglines-{uuid.uuid4().hex[:8]}"
    board = make_redis_board(redis_url, namespace)
    try:
        with persistence_backends.backend("memory://") as persistence:
            board.connect()
            job = post_flow(board, persistence, f"{__name__}.echo_flow", name="echo-job",
                            store={"payload": STORED})
            conductor = BlockingConductor("log-lines", board, persistence=persistence)
            with caplog.at_level(logging.INFO, logger="flowengine.conductors"):
                runner = threading.Thread(target=conductor.run, daemon=True)
                runner.start()
                try:
                    assert job.wait(timeout=60)
                finally:
                    conductor.stop()
                    runner.join(60)
    finally:
        board.close()
        wipe_redis(redis_url, namespace)
    lines = [record.getMessage() for record in caplog.records
             if record.name.startswith("flowengine.conductors")]
    assert any("'echo-job'" in line and job.uuid in line and "completed" in line
               for line in lines), lines
    assert not [line for line in lines if "a-long-stored-value" in line]
