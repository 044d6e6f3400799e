"""Run a flow from the shell: ``flowengine run examples.cli_run:make_flow``.

``make_flow`` is an ordinary flow factory. The ``flowengine`` command imports it by name (from
the current directory), runs the flow, shows each step as it happens and exits with a code that
says how it ended: 0 success, 3 reverted, 4 a revert failed, 5 suspended. ``main()`` runs what
you would type::

    flowengine run examples.cli_run:make_flow --store version=1.2 --json
    flowengine run examples.cli_run:make_flow --store version=1.2 --kwarg broken=true --json

Run: python examples/cli_run.py
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

from flowengine import task
from flowengine.flows import linear_flow

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Build(task.Task):
    def execute(self, version: str) -> str:
        return f"release-{version}.tar.gz"


class Upload(task.Task):
    def execute(self, artifact: str) -> str:
        return f"https://cdn.example/{artifact}"


class SwitchTraffic(task.Task):
    def __init__(self, broken: bool) -> None:
        super().__init__(name="switch_traffic")
        self._broken = broken

    def execute(self, url: str) -> str:
        if self._broken:
            raise RuntimeError(f"health check failed for {url}")
        return "live"


def make_flow(broken: bool = False) -> linear_flow.Flow:
    """Build, upload, switch traffic; with ``broken`` the switch fails and all is undone."""
    return linear_flow.Flow("deploy").add(
        Build("build", provides="artifact"),
        Upload("upload", provides="url"),
        SwitchTraffic(broken),
    )


def flowengine(*args: str) -> tuple[int, dict[str, Any]]:
    """``flowengine ARGS --json`` in a subprocess; its exit code and JSON outcome."""
    args = (*args, "--json")
    print("$ flowengine " + " ".join(args))
    proc = subprocess.run([sys.executable, "-m", "flowengine.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def main() -> None:
    for extra in ([], ["--kwarg", "broken=true"]):
        code, outcome = flowengine("run", "examples.cli_run:make_flow", "--store", "version=1.2",
                                   *extra)
        print(f"exit code {code}: flow {outcome['flow']} {outcome['state']}")
        for atom in outcome["atoms"]:
            print(f"  {atom['name']}: {atom['state']}")
        if outcome["reverted"]:
            print("  revert order: " + " -> ".join(outcome["reverted"]))
        for failure in outcome["failures"]:
            print(f"  failure: {failure['atom']} {failure['type']}: {failure['message']}")


if __name__ == "__main__":
    main()
