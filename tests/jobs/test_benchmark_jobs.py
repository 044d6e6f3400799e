"""Run ``benchmarks/jobs.py`` with tiny sizes on the test Redis and check its report's shape.

Speed is never asserted; this only makes sure the benchmark keeps working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_the_jobs_benchmark_reports_each_measurement(redis_url: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "jobs.py"), "--redis", redis_url, "--jobs",
         "6", "--conductors", "1,2", "--samples", "2", "--claim-ttl", "1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    redis = report["results"]["redis"]
    assert [row["conductors"] for row in redis["throughput"]] == [1, 2]
    assert all(row["consumed"] == 6 and row["jobs_per_s"] > 0 for row in redis["throughput"])
    assert redis["latency"]["samples"] == 2 and redis["latency"]["median_ms"] > 0
    assert redis["failover"]["completed"] is True
    assert "latency_median_taskflow_over_flowengine" in report["ratios"]
