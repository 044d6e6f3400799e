"""Runs ``examples/jobboard_failover.py`` as a user would, on the test Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_the_failover_example_tells_its_story(redis_url: str) -> None:
    env = {**os.environ, "FLOWENGINE_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "jobboard_failover.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    victim = re.search(r"^(alpha|beta) claimed the job and is running install$", out, re.M)
    assert victim is not None, out
    survivor = {"alpha": "beta", "beta": "alpha"}[victim.group(1)]
    took = re.search(rf"^{survivor} finished the job ([\d.]+)s after the kill", out, re.M)
    assert took is not None and float(took.group(1)) < 3 + 2, out
    assert f"allocate: completed 1 time(s), by {victim.group(1)}" in out
    assert f"install: completed 1 time(s), by {survivor}" in out
    assert f"configure: completed 1 time(s), by {survivor}" in out
