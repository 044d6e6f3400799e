"""How jobs end: kept, recorded, and shown (``flowengine jobs list --backend``), never vanished.

A real ``flowengine conductor`` process on the real Redis runs four jobs: one that succeeds, one
whose flow is reverted, one that cannot start (an input is missing) and one no engine can be
made from (trashed). The logbooks of the three that did not succeed stay, each with how it
ended and why; with ``--delete-succeeded`` only the one that succeeded is deleted. ``flowengine
jobs post`` refuses a flow whose inputs are missing, naming them, before anything is posted.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs_flows
import pytest
from board_stage import BoardStage
from boards import wipe_redis
from click.testing import CliRunner
from conductor_procs import Conductor, conductors, wait_for

from flowengine.cli.main import cli
from flowengine.jobs import endings
from flowengine.persistence import models

__all__ = ["conductors"]  # a fixture, imported for pytest


@pytest.fixture
def stage(redis_url: str, tmp_path: Path) -> Iterator[BoardStage]:
    namespace = f"fe-endings-{uuid.uuid4().hex[:10]}"
    made = BoardStage(redis_url, {"namespace": namespace, "claim_ttl": 5.0}, tmp_path,
                      lambda: wipe_redis(redis_url, namespace))
    yield made
    made.close()


def _post_unbuildable(stage: BoardStage) -> str:
    """A job whose stored factory names nothing importable (TaskFlow's way, by hand)."""
    book = models.LogBook("unbuildable")
    flow_detail = models.FlowDetail("unbuildable", str(uuid.uuid4()))
    book.add(flow_detail)
    flow_detail.meta = {"factory": {"name": "no_such_module.make_flow", "args": [],
                                    "kwargs": {}}}
    with contextlib.closing(stage.persistence.get_connection()) as conn:
        conn.save_logbook(book)
    return stage.board.post("unbuildable", book, details={"flow_uuid": flow_detail.uuid}).uuid


def _books(stage: BoardStage) -> dict[str, models.LogBook]:
    with contextlib.closing(stage.persistence.get_connection()) as conn:
        return {book.name: book for book in conn.get_logbooks(lazy=True)}


def _run_all(stage: BoardStage, conductors: list[Conductor], *extra: str) -> dict[str, str]:
    """Post the four jobs, run them on a conductor process; their uuids by kind."""
    posted = {"success": stage.post(jobs_flows.steps).uuid,
              "reverted": stage.post(jobs_flows.reverting).uuid,
              "needy": stage.post(jobs_flows.needy).uuid,
              "unbuildable": _post_unbuildable(stage)}
    conductor = Conductor("ender", stage.board_uri, stage.options, stage.backend_uri,
                          stage.workdir, *extra)
    conductors.append(conductor)
    for job in list(stage.board.iterjobs(ensure_fresh=True)):
        assert job.wait(timeout=60), conductor.output()
    # A job leaves the board first; its ending is recorded next (none for a deleted logbook).
    recorded = 3 if "--delete-succeeded" in extra else 4
    wait_for(lambda: len(endings.find_endings(stage.persistence, stage.board)) == recorded, 30,
             f"the conductor recording how the jobs ended\n{conductor.output()}")
    assert conductor.process.poll() is None, conductor.output()
    return posted


@pytest.mark.integration
def test_failed_jobs_keep_their_logbooks_and_say_how_they_ended(
        stage: BoardStage, conductors: list[Conductor]) -> None:
    posted = _run_all(stage, conductors)
    books = _books(stage)
    assert set(books) == {"steps", "reverting", "needy", "unbuildable"}  # nothing deleted
    ended = {e.job_uuid: e for e in endings.find_endings(stage.persistence, stage.board)}
    assert ended[posted["success"]].outcome == endings.SUCCESS
    assert ended[posted["reverted"]].outcome == endings.REVERTED
    assert "broken failed: ValueError: broken on purpose" in ended[posted["reverted"]].reason
    assert ended[posted["needy"]].outcome == endings.FAILED
    assert "could not start" in ended[posted["needy"]].reason
    assert "volume_size" in ended[posted["needy"]].reason
    assert ended[posted["unbuildable"]].outcome == endings.TRASHED
    assert "no_such_module" in ended[posted["unbuildable"]].reason
    listing = CliRunner().invoke(cli, ["jobs", "list", "--board", stage.board_uri,
                                       "--board-option", f"namespace={stage.options['namespace']}",
                                       "--backend", stage.backend_uri, "--json"])
    assert listing.exit_code == 0, listing.output
    shown = {row["uuid"]: row for row in _json_lines(listing.output)}
    assert {shown[u]["ended"] for u in posted.values()} == set(endings.OUTCOMES)
    text = CliRunner().invoke(cli, ["jobs", "list", "--board", stage.board_uri,
                                    "--board-option", f"namespace={stage.options['namespace']}",
                                    "--backend", stage.backend_uri])
    assert "ended jobs" in text.output and "REVERTED" in text.output, text.output


@pytest.mark.integration
def test_only_succeeded_logbooks_are_deleted_and_only_when_asked(
        stage: BoardStage, conductors: list[Conductor]) -> None:
    posted = _run_all(stage, conductors, "--delete-succeeded")
    assert set(_books(stage)) == {"reverting", "needy", "unbuildable"}
    ended = {e.job_uuid for e in endings.find_endings(stage.persistence, stage.board)}
    assert ended == {posted["reverted"], posted["needy"], posted["unbuildable"]}


def test_jobs_post_refuses_missing_inputs_in_one_line(stage: BoardStage,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(jobs_flows.__file__).parent)
    args = ["jobs", "post", "--board", stage.board_uri, "--board-option",
            f"namespace={stage.options['namespace']}", "--backend", stage.backend_uri,
            "jobs_flows:needy"]
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 1
    [line] = refused.output.strip().splitlines()
    assert "volume_size" in line and "--store volume_size=VALUE" in line, line
    assert list(stage.board.iterjobs(ensure_fresh=True)) == [] and _books(stage) == {}
    accepted = CliRunner().invoke(cli, [*args, "--store", "volume_size=10"])
    assert accepted.exit_code == 0, accepted.output
    [job] = list(stage.board.iterjobs(ensure_fresh=True))
    assert job.uuid == accepted.output.strip() and job.details["store"] == {"volume_size": 10}


def _json_lines(output: str) -> list[dict[str, Any]]:
    """The rows a ``--json`` command printed, one JSON object per line."""
    return [json.loads(line) for line in output.splitlines() if line.strip()]
