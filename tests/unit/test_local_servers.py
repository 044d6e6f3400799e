"""The test setup starts the servers the worker tests (and all real-server tests) need.

``tests/conftest.py`` gives every test session one ``LocalServers``: when a server does not
answer, it runs ``.ci/services.sh start`` once (if the servers are installed) and checks again;
a server still missing fails the test under ``CI=true`` and skips it otherwise. Here it runs a
stand-in script that records each run, and "servers" that are files the script creates.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from servers import LocalServers  # tests/ is on sys.path (rootdir conftest)


class Stage:
    """A stand-in start script, the log of its runs, and the server it "starts"."""

    def __init__(self, tmp_path: Path, body: str = "touch \"$UP\"") -> None:
        self.log, self.up = tmp_path / "runs.log", tmp_path / "server-up"
        self.script = tmp_path / "services.sh"
        self.script.write_text(f'UP="{self.up}"\necho "$1" >> "{self.log}"\n{body}\n')

    def runs(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def check(self) -> str | None:
        return None if self.up.exists() else "ConnectionRefusedError: refused"


def servers_for(stage: Stage, programs: list[str] | None = None,
                patience: float = 0.3) -> LocalServers:
    """A fresh :class:`LocalServers`, on ``stage``'s script."""
    return LocalServers(script=stage.script, programs=programs or [sys.executable],
                        patience=patience)


def test_a_server_that_answers_starts_nothing(tmp_path: Path) -> None:
    stage = Stage(tmp_path)
    stage.up.touch()
    servers = servers_for(stage)
    assert servers.problem(stage.check) is None
    assert stage.runs() == []


def test_a_missing_server_is_started_once_and_checked_again(tmp_path: Path) -> None:
    stage = Stage(tmp_path)
    servers = servers_for(stage)
    assert servers.problem(stage.check) is None
    assert servers.problem(stage.check) is None
    assert stage.runs() == ["start"]


def test_servers_not_installed_are_named_and_not_started(tmp_path: Path) -> None:
    stage = Stage(tmp_path)
    servers = servers_for(stage,
                          programs=["no-such-server-program", "/nowhere/*/bin/postgres"])
    reason = servers.problem(stage.check)
    assert reason == ("ConnectionRefusedError: refused; could not start it: not installed: "
                      "no-such-server-program, /nowhere/*/bin/postgres (`.ci/run` installs them)")
    assert stage.runs() == []


def test_a_failing_start_script_is_reported_and_not_run_again(tmp_path: Path) -> None:
    stage = Stage(tmp_path, body='echo "permission denied" >&2; exit 3')
    servers = servers_for(stage)
    first = servers.problem(stage.check)
    assert first is not None and "exited with 3: permission denied" in first
    assert servers.problem(stage.check) == first
    assert stage.runs() == ["start"]


def test_a_server_still_refusing_after_the_start_gives_the_last_reason(tmp_path: Path) -> None:
    stage = Stage(tmp_path, body="true")  # "starts" nothing
    servers = servers_for(stage, patience=0.2)
    assert servers.problem(stage.check) == (
        f"ConnectionRefusedError: refused; still, after `{stage.script} start`")


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception),
                                             ("", pytest.skip.Exception)])
def test_a_still_missing_server_fails_under_ci_and_skips_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str,
    outcome: type[BaseException],
) -> None:  # fmt: skip
    monkeypatch.setenv("CI", ci)
    stage = Stage(tmp_path)
    servers = servers_for(stage, programs=["no-such-server-program"])
    with pytest.raises(outcome, match=r"Redis test server unavailable \(ConnectionRefused"):
        servers.require("Redis test server", stage.check)
