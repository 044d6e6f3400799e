"""Cancelling a flow that a conductor runs, through its job: ``flowengine jobs cancel``, and a
deadline given when the job was posted. A real ``flowengine conductor`` process runs the job
(its third task loops until cancelled); the job ends consumed, with its flow REVERTED and the
cancel recorded, never in the trash. The tasks' ledger says what ran."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stopping_flows as sf
from boards import make_redis_board, wipe_redis
from click.testing import CliRunner, Result
from conductor_procs import Conductor, conductors, wait_for

from flowengine import states
from flowengine.cli import exits
from flowengine.cli.main import cli
from flowengine.engines.stopping import META_CANCELLED
from flowengine.jobs.base import JobBoard
from flowengine.persistence import backends

__all__ = ["conductors"]  # a fixture, imported for pytest

pytestmark = pytest.mark.integration

#: Seconds a conductor gets to do what takes it a fraction of that.
WAIT = 60.0
TESTS = Path(sf.__file__).resolve().parent


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    name = f"fe-cancel-{uuid.uuid4().hex[:10]}"
    yield name
    wipe_redis(redis_url, name)


@pytest.fixture
def board(redis_url: str, namespace: str) -> Iterator[JobBoard]:
    made = make_redis_board(redis_url, namespace, claim_ttl=5)
    made.connect()
    yield made
    made.close()


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tasks' ledger; conductor processes started from now on write to it (and import
    the flows from ``tests/``)."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(sf.LEDGER_ENV, str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    return path


def _cli(redis_url: str, namespace: str, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args[:2], "--board", redis_url, "--board-option",
                                    f"namespace={namespace}", *args[2:]],
                              catch_exceptions=False)


def _events(ledger: Path, event: str) -> list[str]:
    return [line["atom"] for line in sf.read(ledger) if line["event"] == event]


def _stored_meta(backend_uri: str, flow_uuid: str) -> tuple[str | None, dict[str, Any]]:
    with backends.backend(backend_uri) as backend:
        conn = backend.get_connection()
        try:
            fd = conn.get_flow_details(flow_uuid)
        finally:
            conn.close()
    return fd.state, fd.meta


def _check_cancelled(board: JobBoard, ledger: Path, backend_uri: str, flow_uuid: str,
                     conductor: Conductor, reason: str) -> None:
    wait_for(lambda: not list(board.iterjobs(ensure_fresh=True)), WAIT, "the job consumed")
    assert list(board.iter_trash()) == []
    assert _events(ledger, "execute") == ["s1", "s2", "s3"]
    assert _events(ledger, "revert") == ["s3", "s2", "s1"]
    state, meta = _stored_meta(backend_uri, flow_uuid)
    assert state == states.REVERTED and meta[META_CANCELLED]["reason"] == reason
    wait_for(lambda: "was cancelled and its work reverted (consuming it)" in conductor.output(),
             WAIT, "the conductor saying so")


def test_a_job_cancelled_through_the_board_is_consumed_with_its_flow_reverted(
        redis_url: str, namespace: str, board: JobBoard, conductors: list[Conductor],
        ledger: Path, tmp_path: Path) -> None:
    backend_uri = f"sqlite:///{tmp_path / 'flows.db'}"
    posted = _cli(redis_url, namespace, "jobs", "post", "--backend", backend_uri,
                  "stopping_flows:five")
    assert posted.exit_code == 0, posted.output
    job_id = posted.output.strip()
    [job] = list(board.iterjobs(ensure_fresh=True))
    conductor = Conductor("canceller", redis_url, {"namespace": namespace}, backend_uri,
                          tmp_path, "--keep-logbooks")
    conductors.append(conductor)
    wait_for(lambda: "s3" in _events(ledger, "execute"), WAIT, "task 3 running")

    cancelled = _cli(redis_url, namespace, "jobs", "cancel", job_id[:8], "--backend",
                     backend_uri, "--reason", "ticket closed", "--wait", str(WAIT))
    assert cancelled.exit_code == exits.CANCELLED, cancelled.output
    assert "cancel requested for flow 'stopping_flows.five'" in cancelled.output
    assert f"pid {conductor.pid}" in cancelled.output
    _check_cancelled(board, ledger, backend_uri, job.details["flow_uuid"], conductor,
                     "ticket closed")
    _, meta = _stored_meta(backend_uri, job.details["flow_uuid"])
    assert meta[META_CANCELLED]["by"].endswith("(flowengine jobs cancel)")


def test_a_job_posted_with_a_deadline_is_cancelled_when_it_expires(
        redis_url: str, namespace: str, board: JobBoard, conductors: list[Conductor],
        ledger: Path, tmp_path: Path) -> None:
    backend_uri = f"sqlite:///{tmp_path / 'flows.db'}"
    # From when it is posted: long enough for the conductor to start and reach task 3.
    posted = _cli(redis_url, namespace, "jobs", "post", "--backend", backend_uri,
                  "stopping_flows:five", "--deadline", "12")
    assert posted.exit_code == 0, posted.output
    [job] = list(board.iterjobs(ensure_fresh=True))
    conductor = Conductor("bounded", redis_url, {"namespace": namespace}, backend_uri,
                          tmp_path, "--keep-logbooks")
    conductors.append(conductor)
    wait_for(lambda: "s3" in _events(ledger, "execute"), WAIT, "task 3 running")
    _check_cancelled(board, ledger, backend_uri, job.details["flow_uuid"], conductor,
                     "deadline")
