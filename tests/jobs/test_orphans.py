"""Orphaned flows: a job lost in an empty Redis restart is reported, and re-posted on request.

A real ``flowengine conductor`` runs job A on a private Redis (A's flow waits at step-2) while
job B waits unclaimed; Redis restarts empty, so the board loses both. While the conductor still
runs A, only B is orphaned (the conductor lists what it holds in its registration); once it
gives A up, ``flowengine check --orphans`` and the dashboard's jobs page report both flows,
stored RUNNING and PENDING with nothing pointing at them. ``flowengine jobs repost-orphans``
posts their jobs again and the conductor finishes both: A from its stored state (step-1, which
completed, does not run again).
"""

from __future__ import annotations

import json
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs_flows
import pytest
from board_stage import BoardStage
from click.testing import CliRunner
from conductor_procs import Conductor, PrivateRedis, conductors, private_redis, wait_for

from flowengine import states
from flowengine.cli.main import cli
from flowengine.jobs import orphans

__all__ = ["conductors", "private_redis"]  # fixtures, imported for pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def stage(private_redis: PrivateRedis, tmp_path: Path) -> Iterator[BoardStage]:
    namespace = f"fe-orphans-{uuid.uuid4().hex[:10]}"
    made = BoardStage(private_redis.url, {"namespace": namespace, "claim_ttl": 2.0}, tmp_path,
                      lambda: None)
    yield made
    made.close()


def _restart_empty(server: PrivateRedis) -> None:
    server.stop()
    for name in ("appendonlydir", "appendonly.aof", "dump.rdb"):
        found = server.workdir / name
        if found.is_dir():
            shutil.rmtree(found)
        elif found.exists():
            found.unlink()
    server.start()


def _cli(stage: BoardStage, *args: str) -> Any:
    return CliRunner().invoke(cli, [*args, "--board", stage.board_uri, "--board-option",
                                    f"namespace={stage.options['namespace']}",
                                    "--board-option", "claim_ttl=2", "--backend",
                                    stage.backend_uri])


def _reported(stage: BoardStage) -> dict[str, str | None]:
    result = _cli(stage, "check", "--orphans", "--json")
    assert result.exit_code in (0, 1), result.output
    return {row["flow_uuid"]: row["state"] for row in _json_lines(result.output)}


def _books_held(stage: BoardStage) -> list[str]:
    return [book for entity in stage.board.iter_entities("conductor")
            for book in entity.metadata.get(orphans.HOLDING_KEY) or ()]


def test_flows_of_jobs_lost_in_an_empty_restart_are_reported_and_reposted(
        stage: BoardStage, private_redis: PrivateRedis, conductors: list[Conductor]) -> None:
    conductor = stage.conductor(conductors, "steady")
    stage.wait_registered(conductor)
    other_ledger = stage.workdir / "ledger-b"
    job_a = stage.post(jobs_flows.steps, gate=str(stage.gate), gated_step="step-2")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
    job_b = stage.post(jobs_flows.steps, ledger=str(other_ledger))  # --max-jobs 1: waits
    flow_a, flow_b = job_a.details["flow_uuid"], job_b.details["flow_uuid"]
    assert _reported(stage) == {}  # both jobs are on the board

    _restart_empty(private_redis)
    # The conductor registers again, still running A (its claim is gone with the data).
    wait_for(lambda: job_a.book_uuid in _books_held(stage), 30,
             f"the conductor listing A as held\n{conductor.output()}")
    assert _reported(stage) == {flow_b: None}
    stage.gate.touch()  # A's step-2 ends; the conductor cannot record it, and gives A up
    wait_for(lambda: job_a.book_uuid not in _books_held(stage), 30,
             f"the conductor giving A up\n{conductor.output()}")
    assert _reported(stage) == {flow_a: states.RUNNING, flow_b: None}
    text = _cli(stage, "check", "--orphans")
    assert text.exit_code == 1 and "2 orphaned flow(s)" in text.output, text.output
    assert "repost-orphans" in text.output
    page = _jobs_page(stage)
    assert "2 orphaned flows" in page and f'data-orphan="{flow_a}"' in page
    assert f'data-orphan="{flow_b}"' in page

    reposted = _cli(stage, "jobs", "repost-orphans")
    assert reposted.exit_code == 0, reposted.output
    assert f"({flow_a}, RUNNING)" in reposted.output and f"({flow_b}, PENDING)" in reposted.output
    wait_for(lambda: not list(stage.board.iterjobs(ensure_fresh=True)), 60,
             f"the re-posted jobs to finish\n{conductor.output()}")
    # A resumed from its stored state: step-1 ran once; step-2 ran again (its first result was
    # never recorded), then step-3. B ran from the start.
    assert jobs_flows.ledger_lines(stage.ledger) == ["step-1", "step-2", "step-2", "step-3"]
    assert jobs_flows.ledger_lines(other_ledger) == ["step-1", "step-2", "step-3"]
    assert _reported(stage) == {} and conductor.process.poll() is None
    assert _cli(stage, "check", "--orphans").exit_code == 0


def _jobs_page(stage: BoardStage) -> str:
    from flowengine.dashboard import DashboardData, EventHub, create_app
    from flowengine.jobs import backends

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    board = backends.fetch("dashboard", {"board": stage.board_uri, **stage.options},
                           persistence=stage.persistence)
    board.connect()
    try:
        with TestClient(create_app(DashboardData(stage.persistence, EventHub(None),
                                                 board=board))) as app:
            return str(app.get("/jobs").text)
    finally:
        board.close()


def test_repost_orphans_says_when_a_flow_id_names_no_orphan(stage: BoardStage) -> None:
    result = _cli(stage, "jobs", "repost-orphans", "--wait", "0")
    assert result.exit_code == 0 and "no orphaned flow to re-post" in result.output
    job = stage.post(jobs_flows.steps)
    stage.board.claim(job, "someone")
    stage.board.consume(job, "someone")  # gone, its flow never ran, nothing recorded an end
    result = _cli(stage, "jobs", "repost-orphans", "nope", "--wait", "0")
    assert result.exit_code == 2 and "no orphaned flow with a uuid starting 'nope'" in \
        result.output
    result = _cli(stage, "jobs", "repost-orphans", job.details["flow_uuid"][:8], "--wait", "0")
    assert result.exit_code == 0 and "reposted flow 'steps'" in result.output


class _DeletedOnceListed:
    """A store whose logbooks vanish right after they are listed, as they do when a conductor
    with ``delete_logbook=True`` finishes a job while ``find_orphans`` reads the store."""

    def __init__(self, persistence: Any) -> None:
        self._persistence = persistence

    def get_connection(self) -> Any:
        conn = self._persistence.get_connection()
        listed = conn.get_logbooks

        def get_logbooks(lazy: bool = False) -> list[Any]:
            books = list(listed(lazy=lazy))
            for book in books:
                conn.destroy_logbook(book.uuid)
            return books

        conn.get_logbooks = get_logbooks
        return conn


def test_a_logbook_deleted_while_orphans_are_sought_is_not_an_orphan(stage: BoardStage) -> None:
    job = stage.post(jobs_flows.steps)
    stage.board.claim(job, "someone")
    stage.board.consume(job, "someone")  # an orphan, until its logbook goes
    assert [o.flow_uuid for o in orphans.find_orphans(stage.board, stage.persistence)] == \
        [job.details["flow_uuid"]]
    assert orphans.find_orphans(stage.board, _DeletedOnceListed(stage.persistence)) == []


def _json_lines(output: str) -> list[dict[str, Any]]:
    """The rows a ``--json`` command printed, one JSON object per line."""
    return [json.loads(line) for line in output.splitlines() if line.strip()]
