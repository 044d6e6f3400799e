"""What ``flowengine`` imports to start: ``--help`` and the light commands stay light.

Start-up time is measured by hand (doc/operations.rst gives the numbers), never asserted: what
is pinned here is what gets imported, which is what start-up time is made of.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import click
import pytest

from flowengine.cli.main import COMMANDS, cli

#: Packages no command needs just to start: the engine's graph library and schemas, the broker
#: client library and its Redis transport, OpenTelemetry, the dashboard's web stack.
HEAVY = ("networkx", "jsonschema", "kombu", "redis", "opentelemetry", "prometheus_client",
         "starlette", "uvicorn", "sqlalchemy")
#: What each command may import of them.
ALLOWED: dict[tuple[str, ...], frozenset[str]] = {
    ("--help",): frozenset(),
    ("--version",): frozenset(),
    ("flows", "--help"): frozenset(),
    ("worker", "--help"): frozenset(),
    ("run", "--help"): frozenset({"networkx"}),  # the module that runs flows loads the engines
    ("events", "--help"): frozenset(),
    ("workers", "--help"): frozenset(),
    ("topics", "--help"): frozenset(),
    ("jobs", "--help"): frozenset(),
    ("dashboard", "--help"): frozenset(),
    # Reading stored flows needs the SQL backend, and nothing else heavy.
    ("flows", "--backend", "sqlite://"): frozenset({"sqlalchemy"}),
}

_REPORT = """
import json, sys
sys.argv = ["flowengine", *json.loads(sys.argv[1])]
from flowengine.cli.main import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})), file=sys.stderr)
"""


def _imported(args: tuple[str, ...]) -> set[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLOWENGINE_")}
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _REPORT, json.dumps(list(args))],
                          capture_output=True, text=True, timeout=120, env=env)
    return set(json.loads(proc.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", list(ALLOWED), ids=" ".join)
def test_starting_a_command_imports_nothing_heavy(args: tuple[str, ...]) -> None:
    heavy = _imported(args) & set(HEAVY)
    assert heavy <= ALLOWED[args], f"flowengine {' '.join(args)} imports {sorted(heavy)}"


def test_the_command_list_is_every_command_with_its_own_summary() -> None:
    loaded = {name: cli.commands[name] for name in COMMANDS}
    for name, command in loaded.items():
        assert command.name == name
        summary = click.Command(name, help=COMMANDS[name].summary)
        for limit in (45, 60, 200):
            assert summary.get_short_help_str(limit) == command.get_short_help_str(limit), name
    assert list(COMMANDS) == sorted(COMMANDS)
