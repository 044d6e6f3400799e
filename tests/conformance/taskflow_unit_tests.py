"""TaskFlow 6.5's own unit tests, run on flowengine with their imports renamed, and their counts.

TaskFlow's tests (``taskflow/tests`` in the installed ``taskflow`` package, and
``taskflow/test.py``) are copied into a scratch package, ``tfconf``, with their imports
renamed to flowengine's (``rename``) as a user migrating would, and the selected modules run
with pytest in one child process (``taskflow_runner``, which also explains the three ways that
process adapts pytest and this machine to TaskFlow's runner). Each module's passing tests are
counted. The selection is TaskFlow's public-behaviour modules (engines, patterns, storage,
persistence, failures, retries...) and its jobboard and conductor modules, which run against the
real Redis, ZooKeeper and etcd servers on 127.0.0.1 (TaskFlow's default ports).

``taskflow_unit_counts.json`` beside this file records, per module, how many tests pass on
TaskFlow itself and the floor flowengine must keep, plus every TaskFlow test flowengine fails
and why (each a deliberate difference or a TaskFlow internal). ``test_taskflow_unit_tests``
runs the flowengine side in CI and fails below a floor.

``python -m conformance.taskflow_unit_tests`` (from ``tests/``) measures both libraries and
prints JSON: per module, the tests passed on TaskFlow and on flowengine, the overall ratio, and
the TaskFlow tests flowengine fails that the counts file does not name. ``--record`` also
writes the TaskFlow counts and raises each floor to what flowengine now passes (never lowers
it). Set ``FLOWENGINE_SOURCE`` to a directory holding another ``flowengine`` package to
measure it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path
from typing import Any

from .rename import rename_source

TASKFLOW = Path(__import__("taskflow").__file__).parent
#: TaskFlow's public-behaviour test modules (relative to its ``tests/unit``).
CORE_MODULES = (
    "test_engines.py", "test_flow_dependencies.py", "test_storage.py", "test_failure.py",
    "test_retries.py", "test_suspend.py", "test_arguments_passing.py", "test_notifier.py",
    "test_engine_helpers.py", "test_task.py", "test_progress.py",
    "patterns/test_graph_flow.py", "patterns/test_linear_flow.py",
    "patterns/test_unordered_flow.py",
    "persistence/test_memory_persistence.py", "persistence/test_dir_persistence.py",
)
#: Its jobboard and conductor modules (real Redis, ZooKeeper and etcd servers).
JOB_MODULES = (
    "jobs/test_entrypoint.py", "jobs/test_redis_job.py", "jobs/test_zk_job.py",
    "jobs/test_etcd_job.py", "test_conductors.py",
)
MODULES = CORE_MODULES + JOB_MODULES
PACKAGE = "tfconf"
COUNTS = Path(__file__).with_name("taskflow_unit_counts.json")
RUNNER = Path(__file__).with_name("taskflow_runner.py")
#: Seconds the child process may take: a hung test is cut short by TaskFlow's own waits
#: (``WAIT_TIMEOUT``, which the runner lowers), so reaching this means something else hangs.
TIME_LIMIT = 1500.0


@dataclasses.dataclass
class Run:
    """One library's run: per module, the ids (``Class::test``) of its passing and failing
    tests (skipped ones are in neither), and how long the child process took."""

    passed: dict[str, set[str]]
    failed: dict[str, set[str]]
    seconds: float
    output: str

    def counts(self) -> dict[str, int]:
        """Passing tests per module."""
        return {module: len(self.passed.get(module, ())) for module in MODULES}


def copy_tests(target: Path, lib: str) -> Path:
    """Copy TaskFlow's tests to ``target/tfconf``, their imports renamed for ``lib``."""
    package = target / PACKAGE
    shutil.copytree(TASKFLOW / "tests", package / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(TASKFLOW / "test.py", package / "test.py")
    (package / "__init__.py").write_text("")
    for path in package.rglob("*.py"):
        text = re.sub(r"\bfrom taskflow import test\b", f"from {PACKAGE} import test",
                      path.read_text())
        text = re.sub(r"(?<![\w.])taskflow\.tests\b", f"{PACKAGE}.tests", text)
        if lib == "flowengine":
            text = rename_source(text)
        path.write_text(text)
    return package


def flowengine_source() -> str:
    """The directory the child imports flowengine from: ``$FLOWENGINE_SOURCE``, or the one this
    process imported it from (a checkout on ``PYTHONPATH`` wins over the editable install)."""
    import flowengine

    return os.environ.get("FLOWENGINE_SOURCE") or str(Path(flowengine.__file__).parents[1])


def run(lib: str, modules: tuple[str, ...] = MODULES) -> Run:
    """Run ``modules`` of TaskFlow's tests, imports renamed for ``lib``, in one child process."""
    with tempfile.TemporaryDirectory(prefix=f"tfconf-{lib}-") as scratch:
        root = Path(scratch)
        copy_tests(root, lib)
        report = root / "report.xml"
        args = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE",
                "--continue-on-collection-errors", f"--junitxml={report}",
                *(str(root / PACKAGE / "tests" / "unit" / module) for module in modules)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [flowengine_source(), os.environ.get("PYTHONPATH")])))
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, str(RUNNER), *args], cwd=root, env=env,
                                  capture_output=True, text=True, timeout=TIME_LIMIT)
            output = done.stdout + done.stderr
        except subprocess.TimeoutExpired as err:  # its output comes as bytes
            partial = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) \
                else str(err.stdout or "")
            output = f"TaskFlow's tests on {lib} did not finish within {TIME_LIMIT:.0f}s\n{partial}"
        seconds = time.monotonic() - started
        passed, failed = _outcomes(report) if report.exists() else ({}, {})
    return Run(passed, failed, seconds, output)


def _module_and_id(classname: str, name: str) -> tuple[str, str]:
    """``(jobs/test_zk_job.py, ZookeeperJobboardTest::test_x)`` from a JUnit test case."""
    # The class may carry a scenario, "ManyConductorTest(blocking)", with no dot in it.
    head, _, cls = classname.rpartition(".")
    module = head.removeprefix(f"{PACKAGE}.tests.unit.").replace(".", "/") + ".py"
    return module, f"{cls}::{name}"


def _outcomes(report: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per module, the passing and the failing tests of a JUnit report."""
    passed: dict[str, set[str]] = {}
    failed: dict[str, set[str]] = {}
    skipped: set[tuple[str, str]] = set()
    for case in ET.parse(report).iter("testcase"):
        module, test = _module_and_id(case.get("classname", ""), case.get("name", ""))
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            failed.setdefault(module, set()).add(test)
        elif "skipped" in tags:
            skipped.add((module, test))
        else:
            passed.setdefault(module, set()).add(test)
    for module, tests in failed.items():  # an error at teardown follows a passing call
        passed[module] = passed.get(module, set()) - tests
    for module, test in skipped:
        passed.get(module, set()).discard(test)
    return passed, failed


def recorded() -> dict[str, Any]:
    """The counts file."""
    data: dict[str, Any] = json.loads(COUNTS.read_text())
    return data


def named_differences(counts: dict[str, Any]) -> dict[str, str]:
    """Each TaskFlow test the counts file names as failing on flowengine, with why."""
    return {test: entry["why"] for entry in counts["differences"] for test in entry["tests"]}


def unnamed_failures(fe_run: Run, counts: dict[str, Any]) -> list[str]:
    """TaskFlow tests flowengine failed that the counts file does not name."""
    named = named_differences(counts)
    return sorted(f"{module}::{test}" for module, tests in fe_run.failed.items()
                  for test in tests if f"{module}::{test}" not in named)


def measure() -> dict[str, Any]:
    """Both libraries' runs: per module counts, the overall ratio, and what is not named."""
    on_taskflow = run("taskflow")
    on_flowengine = run("flowengine")
    modules: dict[str, dict[str, int]] = {}
    not_on_flowengine: list[str] = []
    for module in MODULES:
        tf_passed = on_taskflow.passed.get(module, set())
        fe_passed = on_flowengine.passed.get(module, set()) & tf_passed
        modules[module] = {"taskflow": len(tf_passed), "flowengine": len(fe_passed)}
        not_on_flowengine += sorted(f"{module}::{t}" for t in tf_passed - fe_passed)
    total_tf = sum(m["taskflow"] for m in modules.values())
    total_fe = sum(m["flowengine"] for m in modules.values())
    named = named_differences(recorded())
    return {"taskflow_version": metadata.version("taskflow"), "modules": modules,
            "taskflow_passed": total_tf, "flowengine_passed": total_fe,
            "pass_rate": round(total_fe / total_tf, 4) if total_tf else None,
            "seconds": {"taskflow": round(on_taskflow.seconds), "flowengine":
                        round(on_flowengine.seconds)},
            "failing_on_flowengine": not_on_flowengine,
            "not_named": [t for t in not_on_flowengine if t not in named]}


def record(measured: dict[str, Any]) -> None:
    """Write TaskFlow's counts and raise flowengine's floors to ``measured`` (never lower)."""
    counts = recorded()
    version = measured["taskflow_version"]
    counts["taskflow_version"] = ".".join(version.split(".")[:2])
    for module, seen in measured["modules"].items():
        entry = counts["modules"].setdefault(module, {"taskflow": 0, "flowengine": 0})
        entry["taskflow"] = seen["taskflow"]
        entry["flowengine"] = max(entry["flowengine"], seen["flowengine"])
    COUNTS.write_text(dump(counts))


def dump(counts: dict[str, Any]) -> str:
    """The counts file's text: one line per module and per difference's test."""
    rows = ",\n".join(f"    {json.dumps(module)}: {json.dumps(entry)}"
                       for module, entry in counts["modules"].items())
    differences = json.dumps(counts["differences"], indent=2).replace("\n", "\n  ")
    return (f'{{\n  "about": {json.dumps(counts["about"])},\n'
            f'  "taskflow_version": {json.dumps(counts["taskflow_version"])},\n'
            f'  "modules": {{\n{rows}\n  }},\n  "differences": {differences}\n}}\n')


def internal_tests(counts: dict[str, Any]) -> int:
    """How many tests the counts file names as testing TaskFlow's internals."""
    return sum(len(entry["tests"]) for entry in counts["differences"]
               if entry["kind"] == "internal")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true",
                        help="write TaskFlow's counts and raise flowengine's floors")
    measured = measure()
    if parser.parse_args().record:
        record(measured)
    json.dump(measured, sys.stdout, indent=2)
    print()
