"""``flowengine jobs ...``, ``flowengine conductors`` and ``flowengine conductor`` on Redis."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import jobs_flows
import pytest
from boards import make_redis_board, wipe_redis
from click.testing import CliRunner
from conductor_procs import Conductor, conductors, wait_for

from flowengine import states
from flowengine.cli.main import cli
from flowengine.jobs.base import JobBoard
from flowengine.types.entity import Entity

__all__ = ["conductors"]  # a fixture, imported for pytest


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    name = f"fe-cli-{uuid.uuid4().hex[:10]}"
    yield name
    wipe_redis(redis_url, name)


@pytest.fixture
def board(redis_url: str, namespace: str) -> Iterator[JobBoard]:
    made = make_redis_board(redis_url, namespace, claim_ttl=2)
    made.connect()
    yield made
    made.close()


def _run(redis_url: str, namespace: str, *args: str) -> str:
    result = CliRunner().invoke(cli, [*args[:2], "--board", redis_url, "--board-option",
                                      f"namespace={namespace}", *args[2:]],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_post_list_show_trash_and_repost(redis_url: str, namespace: str, board: JobBoard,
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(jobs_flows.__file__).parent)
    backend = f"sqlite:///{tmp_path / 'flows.db'}"
    job_id = _run(redis_url, namespace, "jobs", "post", "--backend", backend,
                  "jobs_flows:steps", "--arg", "2", "--store", "password=hunter2",
                  "--priority", "high").strip()
    [job] = list(board.iterjobs(ensure_fresh=True))
    assert job.uuid == job_id and job.details["store"] == {"password": "hunter2"}
    listing = _run(redis_url, namespace, "jobs", "list")
    assert job_id in listing and "UNCLAIMED" in listing and "HIGH" in listing
    shown = json.loads(_run(redis_url, namespace, "jobs", "show", job_id[:8]))
    assert shown["details"]["store"] == {"password": "***"} and shown["attempts"] == 0
    assert "hunter2" not in listing + json.dumps(shown)
    _run(redis_url, namespace, "jobs", "trash", job_id[:8], "--reason", "not today")
    trash = [json.loads(line) for line in
             _run(redis_url, namespace, "jobs", "list", "--trash", "--json").splitlines()]
    # The operator's claim only carried the job to the trash: it never ran.
    assert [(t["uuid"], t["reason"], t["attempts"]) for t in trash] == [
        (job_id, "not today", 0)]
    assert _run(redis_url, namespace, "jobs", "repost", job_id[:8]).strip() == \
        f"reposted {job_id}"
    assert job.state == states.UNCLAIMED


def test_unknown_jobs_and_factories_are_named(redis_url: str, namespace: str,
                                              tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["jobs", "show", "--board", redis_url, "--board-option",
                                      f"namespace={namespace}", "nope"])
    assert result.exit_code == 1 and "'nope'" in result.output
    result = CliRunner().invoke(cli, ["jobs", "post", "--board", redis_url, "--backend",
                                      f"sqlite:///{tmp_path / 'f.db'}", "no_such_mod:f"])
    assert result.exit_code == 1 and "no_such_mod" in result.output
    result = CliRunner().invoke(cli, ["jobs", "list", "--board", "pigeon://coop"])
    assert result.exit_code == 2 and "pigeon" in result.output


def test_conductors_lists_the_live_ones(redis_url: str, namespace: str) -> None:
    # Registered for the default 30 s, not the board fixture's 2 s: on a loaded machine two
    # CLI runs can take longer than that.
    board = make_redis_board(redis_url, namespace)
    board.connect()
    board.register_entity(Entity("conductor", "c-1@h:7", {"hostname": "h", "pid": 7}))
    board.close()
    [listed] = _run(redis_url, namespace, "conductors", "--json").splitlines()
    assert json.loads(listed)["name"] == "c-1@h:7"
    assert "c-1@h:7" in _run(redis_url, namespace, "conductors")


@pytest.mark.integration
def test_sigterm_hands_a_running_job_back_uncounted(redis_url: str, namespace: str,
                                                    board: JobBoard, tmp_path: Path,
                                                    conductors: list[Conductor]) -> None:
    from flowengine.jobs.posting import post_flow
    from flowengine.persistence.backends import impl_sqlalchemy

    backend_uri = f"sqlite:///{tmp_path / 'flows.db'}"
    persistence = impl_sqlalchemy.SQLAlchemyBackend({"connection": backend_uri})
    persistence.get_connection().upgrade()
    gate, ledger = tmp_path / "gate", tmp_path / "ledger"
    job = post_flow(board, persistence, jobs_flows.steps,
                    store={"gate": str(gate), "gated_step": "step-2", "ledger": str(ledger)})
    conductor = Conductor("cli", redis_url, {"namespace": namespace, "claim_ttl": 2},
                          backend_uri, tmp_path)
    conductors.append(conductor)
    jobs_flows.wait_for_file(Path(f"{gate}.waiting"), timeout=30)
    conductor.signal(signal.SIGTERM)
    wait_for(lambda: "handing running jobs back" in conductor.output(), 20, "the SIGTERM")
    gate.touch()  # the running atom finishes; nothing after it starts
    assert conductor.process.wait(30) == 0, conductor.output()
    assert job.state == states.UNCLAIMED and job.attempts == 0
    assert jobs_flows.ledger_lines(ledger) == ["step-1", "step-2"]
    assert board.iter_entities("conductor") == []
    persistence.close()
