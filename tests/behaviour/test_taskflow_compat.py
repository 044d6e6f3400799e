"""The same programs give the same outcomes under TaskFlow and under flowengine.

``compat_runner`` runs the programs of ``compat_scenarios`` once per library, each in its own
subprocess (only the import lines differ, as for a user migrating). The TaskFlow interpreter is
this one when ``taskflow`` is importable here, else ``$TASKFLOW_PYTHON`` (default
``/tmp/probe/bin/python``). Without one the tests skip, except under ``CI=true``, where a missing
reference fails the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .compat_scenarios import ENGINES, SCENARIOS

RUNNER = f"{__package__}.compat_runner"
#: The directory the behaviour package is importable from.
PACKAGE_ROOT = Path(__file__).resolve().parents[len(__package__.split("."))]

#: Scenarios where flowengine is known to differ (engine bugs, each reported).
ENGINE_BUGS: dict[str, str] = {}


def scenario_params() -> list:
    found = []
    for name in SCENARIOS:
        marks = ([pytest.mark.xfail(reason=ENGINE_BUGS[name], strict=True)]
                 if name in ENGINE_BUGS else [])
        found.append(pytest.param(name, marks=marks, id=name))
    return found


def taskflow_python() -> str | None:
    if importlib.util.find_spec("taskflow") is not None:
        return sys.executable
    candidate = os.environ.get("TASKFLOW_PYTHON", "/tmp/probe/bin/python")
    return candidate if Path(candidate).exists() else None


def run_programs(pythons: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Run the scenario program once per library, at the same time; return their outputs."""
    running = {lib: subprocess.Popen([python, "-m", RUNNER, lib], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=PACKAGE_ROOT)
               for lib, python in pythons.items()}
    found = {}
    try:
        for lib, process in running.items():
            stdout, stderr = process.communicate(timeout=120)
            assert process.returncode == 0, f"{lib} scenarios crashed:\n{stderr[-4000:]}"
            found[lib] = json.loads(stdout)
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return found


@pytest.fixture(scope="session")
def outcomes() -> dict[str, dict[str, Any]]:
    python = taskflow_python()
    if python is None:
        message = "no TaskFlow interpreter (set TASKFLOW_PYTHON)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return run_programs({"taskflow": python, "flowengine": sys.executable})


def test_every_scenario_ran_under_both_libraries(outcomes):
    expected = {f"{name}[{engine}]" for name in SCENARIOS for engine in ENGINES}
    assert set(outcomes["taskflow"]) == expected
    assert set(outcomes["flowengine"]) == expected
    # Guard against comparing two empty runs.
    for lib in ("taskflow", "flowengine"):
        linear = outcomes[lib]["linear_results[serial]"]
        assert linear["fetch_all"] == {"x": 1, "y": 10, "total": 11}, lib
        assert linear["atom_events"][:2] == [["one", "RUNNING"], ["one", "SUCCESS"]], lib


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", scenario_params())
def test_same_outcome_as_taskflow(outcomes, name, engine):
    key = f"{name}[{engine}]"
    expected = outcomes["taskflow"][key]
    actual = outcomes["flowengine"][key]
    assert_same_error(expected["error"], actual["error"])
    if "flow_state" not in expected or "flow_state" not in actual:
        # One library refused the flow while it was built, the other when it ran: only the
        # exception is comparable (flowengine checks items earlier, at ``add``).
        return
    for aspect in sorted(set(expected) - {"error"}):
        assert actual.get(aspect) == expected[aspect], f"{key}: {aspect} differs"
    assert set(actual) == set(expected)


def assert_same_error(expected: dict | None, actual: dict | None) -> None:
    """flowengine raises what TaskFlow raises, or a subclass a TaskFlow ``except`` still catches."""
    if expected is None or actual is None:
        assert actual == expected
        return
    assert expected["type"] in actual["catchable_as"], (
        f"TaskFlow raised {expected['type']}; flowengine raised {actual['type']}, which "
        f"`except {expected['type']}` does not catch")
    assert actual["causes"] == expected["causes"]
