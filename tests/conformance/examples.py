"""Run TaskFlow 6.5's example programs under TaskFlow and, imports renamed, under flowengine.

Each example directory is copied to a scratch directory (renamed for flowengine, unchanged for
TaskFlow) so relative paths and ``import example_utils`` behave alike, then run in a subprocess.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .rename import rename_source
from .taskflow_unit_tests import flowengine_source

EXAMPLES = Path(__import__("taskflow").__file__).parent / "examples"

#: Examples left out, with why: each needs a server. (The ``wbe_*`` ones run their workers on
#: threads over kombu's in-memory transport.)
NEEDS_SERVER = {
    "99_bottles": "ZooKeeper jobboard and conductor",
    "jobboard_produce_consume_colors": "ZooKeeper jobboard",
    "tox_conductor": "ZooKeeper jobboard and conductor",
}
#: TaskFlow's test helpers some examples import (``taskflow.tests.utils``): for flowengine, a
#: renamed copy is importable as ``tfconf.tests.utils``, as for TaskFlow's unit tests.
HELPERS = (("taskflow.tests", "tfconf.tests"),)


def example_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.py")
                  if p.stem not in NEEDS_SERVER and p.stem not in ("__init__", "example_utils"))


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def _copy_examples(target: Path, renamed: bool) -> Path:
    """``target/pkg/examples`` holding the examples (renamed or not); returns the examples dir."""
    examples = target / "pkg" / "examples"
    shutil.copytree(EXAMPLES, examples, ignore=shutil.ignore_patterns("__pycache__"))
    if renamed:
        for path in examples.rglob("*.py"):
            path.write_text(rename_source(path.read_text(), HELPERS))
        helpers = target / "tfconf" / "tests"
        helpers.mkdir(parents=True)
        for package in (target / "tfconf", helpers):
            (package / "__init__.py").write_text("")
        (helpers / "utils.py").write_text(rename_source((EXAMPLES.parent / "tests" /
                                                         "utils.py").read_text()))
    return examples


def run_example(name: str, lib: str, timeout: float = 120) -> Outcome:
    """Run example ``name`` under ``lib`` ("taskflow" or "flowengine")."""
    with tempfile.TemporaryDirectory(prefix=f"conformance-{lib}-") as scratch:
        examples = _copy_examples(Path(scratch), renamed=lib == "flowengine")
        # Examples that draw random numbers draw the same ones on both libraries.
        (Path(scratch) / "sitecustomize.py").write_text("import random\nrandom.seed(0)\n")
        # Scratch files (``persistence_example``'s database) go to this run's own directory.
        # flowengine from the checkout under test (a worktree on PYTHONPATH), not whichever
        # one the virtualenv's editable install points at.
        path = [scratch, flowengine_source()] if lib == "flowengine" else [scratch]
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONPATH": os.pathsep.join(path), "TMPDIR": scratch}
        done = subprocess.run([sys.executable, str(examples / f"{name}.py")], cwd=scratch,
                              env=env, capture_output=True, text=True, timeout=timeout)
    return Outcome(done.returncode, done.stdout, done.stderr)


# What is legitimately random in an example's output, and only that.
_RANDOM = (
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"0x[0-9a-f]+"), "<address>"),
    (re.compile(r"\d+\.\d+ (?:seconds|secs|s)\b"), "<duration>"),
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?"), "<timestamp>"),
    (re.compile(r"/tmp/[\w./-]+"), "<path>"),
    (re.compile(r"(?<=thread ')\d+(?=')"), "<thread>"),
)


def normalise(text: str) -> str:
    for pattern, replacement in _RANDOM:
        text = pattern.sub(replacement, text)
    return text
