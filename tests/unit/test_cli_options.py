"""Every option of every ``flowengine`` command is read from its own environment variable,
``FLOWENGINE_<OPTION>``, and ``--help`` names it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import click
import pytest
from click.core import ParameterSource
from click.testing import CliRunner

from flowengine.cli.main import cli


def commands(group: click.Group = cli, prefix: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden
            and p.name not in ("help", "version")]


def expected_envvar(option: click.Option) -> str:
    long_name = max(option.opts, key=len)
    return "FLOWENGINE_" + long_name.lstrip("-").upper().replace("-", "_")


def sample(option: click.Option) -> tuple[str, object]:
    """A value to put in the variable, and what the option should then hold."""
    kind = option.type
    if option.is_flag:
        return "1", True
    if isinstance(kind, click.Choice):
        choice = str(kind.choices[0])
        return choice, choice
    if isinstance(kind, (click.IntRange, click.FloatRange)) or kind in (click.INT, click.FLOAT):
        return "3", 3
    if option.name == "autoscale":  # MAX,MIN
        return "4,1", (4, 1)
    return "env-value", "env-value"


CASES = [(path, option) for path, command in commands() for option in options(command)]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in os.environ:
        if key.startswith("FLOWENGINE_"):
            monkeypatch.delenv(key)


def test_every_command_is_covered() -> None:
    names = {" ".join(path) for path, _ in commands()}
    assert names == {"cancel", "chaos", "check", "conductor", "conductors", "dashboard",
                     "db import-taskflow", "db status", "db upgrade", "dead-letters list",
                     "dead-letters requeue", "events", "flows", "graph", "jobs cancel",
                     "jobs list", "jobs post", "jobs repost", "jobs repost-orphans", "jobs show",
                     "jobs trash", "locks", "rehearse", "repair", "run", "show", "suspend",
                     "topics list", "topics pause", "topics resume", "worker", "workers"}
    assert len(CASES) > 40


@pytest.mark.parametrize(("path", "option"), CASES,
                         ids=[f"{' '.join(p)} {max(o.opts, key=len)}" for p, o in CASES])
def test_each_option_reads_its_environment_variable(
        path: tuple[str, ...], option: click.Option, monkeypatch: pytest.MonkeyPatch) -> None:
    assert option.envvar == expected_envvar(option)
    raw, value = sample(option)
    monkeypatch.setenv(str(option.envvar), raw)
    command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    ctx = command.make_context(" ".join(path), [], resilient_parsing=True)
    assert option.name is not None
    assert ctx.get_parameter_source(option.name) is ParameterSource.ENVIRONMENT
    held = ctx.params[option.name]
    assert (held[0] if option.multiple else held) == value


@pytest.mark.parametrize("path", sorted({path for path, _ in CASES}))
def test_help_names_each_environment_variable(path: tuple[str, ...]) -> None:
    shown = CliRunner().invoke(cli, [*path, "--help"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())  # help text is wrapped anywhere
    command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    for option in options(command):
        assert f"env var: {option.envvar}" in text, (path, option.name)


def test_only_the_documented_names_are_read() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWENGINE_")}
    script = pathlib.Path(sys.executable).parent / "flowengine"

    def flows(variable: str) -> str:
        return subprocess.run([str(script), "flows", "--backend", "memory://"],
                              env={**env, variable: "1"}, capture_output=True, text=True,
                              timeout=60, check=True).stdout

    assert flows("FLOWENGINE_JSON") == ""  # JSON lines: none, and no "no flows" text
    # Given a prefix, click derives names from the command and parameter: none is honoured.
    assert flows("FLOWENGINE_FLOWS_AS_JSON") == "no flows\n"


def test_events_refuses_taskflow_compat() -> None:
    # The events exchange is flowengine's alone: the option would be accepted and ignored.
    result = CliRunner().invoke(cli, ["events", "--taskflow-compat", "--timeout", "0"])
    assert result.exit_code == 2
    assert "No such option '--taskflow-compat'" in result.stderr
