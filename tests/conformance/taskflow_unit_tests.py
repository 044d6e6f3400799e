"""Measure how many of TaskFlow 6.5's own public-behaviour unit tests pass on flowengine.

``python -m conformance.taskflow_unit_tests`` (from ``tests/``; needs ``oslotest`` and
``testscenarios``, which TaskFlow's tests use) copies ``taskflow/test.py`` and
``taskflow/tests`` into a scratch package, once as they are and once with their imports renamed
to flowengine's (``rename``), runs the selected test modules of each copy with pytest and prints
JSON: per module, the tests passed on TaskFlow and on flowengine, and the overall ratio. A test
TaskFlow itself does not pass is not counted. Slow (a few minutes); not run in CI. Set
``FLOWENGINE_SOURCE`` to a directory holding another ``flowengine`` package to measure it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .rename import rename_source

TASKFLOW = Path(__import__("taskflow").__file__).parent
#: The public-behaviour modules measured (TaskFlow's unit test directory, relative).
MODULES = (
    "test_engines.py", "test_flow_dependencies.py", "test_storage.py", "test_failure.py",
    "test_retries.py", "test_suspend.py", "test_arguments_passing.py", "test_notifier.py",
    "test_engine_helpers.py", "test_task.py", "test_progress.py",
    "patterns/test_graph_flow.py", "patterns/test_linear_flow.py",
    "patterns/test_unordered_flow.py",
    "persistence/test_memory_persistence.py", "persistence/test_dir_persistence.py",
)
PACKAGE = "tfconf"
#: Runs pytest; with $FLOWENGINE_SOURCE set, flowengine is imported from that directory instead
#: of the installed (editable) one, to measure another version (``git archive <commit>``).
_BOOT = """
import os, sys
source = os.environ.get("FLOWENGINE_SOURCE")
if source:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, source)
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def _copy(target: Path, lib: str) -> Path:
    """Copy TaskFlow's tests to ``target/tfconf``, renamed for ``lib``."""
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


def _passed(root: Path, module: str) -> set[str]:
    """Names of the tests in ``module`` that pass."""
    report = root / "report.xml"
    args = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={report}",
            str(root / PACKAGE / "tests" / "unit" / module)]
    subprocess.run([sys.executable, "-c", _BOOT, *args], cwd=root, capture_output=True,
                   text=True, timeout=1800)
    if not report.exists():
        return set()
    text = report.read_text()
    found = set()
    for match in re.finditer(r'<testcase classname="([^"]*)" name="([^"]*)"[^>]*?(/>|>(.*?)'
                             r'</testcase>)', text, re.S):
        body = match.group(4) or ""
        if "<failure" not in body and "<error" not in body and "<skipped" not in body:
            found.add(f"{match.group(1)}.{match.group(2)}")
    report.unlink()
    return found


def measure() -> dict[str, object]:
    """Per module counts, the overall ratio and the TaskFlow tests flowengine fails."""
    results: dict[str, dict[str, int]] = {}
    failing: list[str] = []
    with tempfile.TemporaryDirectory() as tf_dir, tempfile.TemporaryDirectory() as fe_dir:
        _copy(Path(tf_dir), "taskflow")
        _copy(Path(fe_dir), "flowengine")
        for module in MODULES:
            on_taskflow = _passed(Path(tf_dir), module)
            on_flowengine = _passed(Path(fe_dir), module) & on_taskflow
            results[module] = {"taskflow": len(on_taskflow), "flowengine": len(on_flowengine)}
            failing.extend(sorted(on_taskflow - on_flowengine))
    total_tf = sum(r["taskflow"] for r in results.values())
    total_fe = sum(r["flowengine"] for r in results.values())
    return {"modules": results, "taskflow_passed": total_tf, "flowengine_passed": total_fe,
            "pass_rate": round(total_fe / total_tf, 4) if total_tf else None,
            "failing_on_flowengine": failing}


if __name__ == "__main__":
    json.dump(measure(), sys.stdout, indent=2)
    print()
