"""Runs ``examples/jobboard_failover.py``, ``examples/jobs_tracing.py`` and
``examples/jobs_endings.py`` as a user would, on the test Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Slowest test here: 14 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def run_example(script: str, redis_url: str) -> str:
    """What ``examples/<script>`` printed, run on the test Redis; it must succeed."""
    env = {**os.environ, "FLOWENGINE_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_failover_example_tells_its_story(redis_url: str) -> None:
    out = run_example("jobboard_failover.py", redis_url)
    victim = re.search(r"^(alpha|beta) claimed the job and is running install$", out, re.M)
    assert victim is not None, out
    survivor = {"alpha": "beta", "beta": "alpha"}[victim.group(1)]
    # How long it took is the example's to tell; board_stage.py checks the documented bound.
    assert re.search(rf"^{survivor} finished the job [\d.]+s after the kill", out, re.M), out
    assert f"allocate: completed 1 time(s), by {victim.group(1)}" in out
    assert f"install: completed 1 time(s), by {survivor}" in out
    assert f"configure: completed 1 time(s), by {survivor}" in out


def test_the_jobs_tracing_example_prints_one_trace_across_two_conductors(
        redis_url: str) -> None:
    out = run_example("jobs_tracing.py", redis_url)
    assert "job COMPLETE after beta resumed it" in out
    assert len(re.findall(r"^trace [0-9a-f]{32} ", out, re.M)) == 1, out
    assert re.search(r"^    job provision-server .* conductor=alpha$", out, re.M), out
    assert re.search(r"^    job provision-server .* conductor=beta \(linked to 1 earlier span\)$",
                     out, re.M), out
    for step in ("allocate", "install", "configure"):
        assert len(re.findall(rf"^        execute {step} .*outcome=SUCCESS$", out, re.M)) == 1, out


def test_the_endings_example_tells_its_story(redis_url: str) -> None:
    out = run_example("jobs_endings.py", redis_url)
    for line in ("charge: REVERTED (charge failed: RuntimeError: card declined)",
                 "resize: FAILED (it could not start: MissingDependencies: it needs input(s) "
                 "nothing provides: volume_size)",
                 "logbooks kept: charge, resize (provision succeeded: deleted)",
                 "damaged posting at not-a-job: not JSON (Expecting value at character 0); "
                 "moved to the trash: True",
                 "the job posted after it ran: True", "orphaned: nightly (PENDING)",
                 "re-posted as nightly; orphaned now: 0"):
        assert line in out.splitlines(), out
