"""Run ``benchmarks/jobs.py`` with tiny sizes on each test backend and check its report's shape.

Speed is never asserted; this only makes sure the benchmark keeps working on every board and
leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boards
import pytest

ROOT = Path(__file__).resolve().parents[2]

# Slowest test here: 15 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def run_benchmark(*options: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "jobs.py"), "--jobs", "4", "--conductors",
         "1,2", "--samples", "2", "--claim-ttl", "1", *options],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "could not remove" not in proc.stderr, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def check_measurements(row: dict[str, Any]) -> None:
    assert [got["conductors"] for got in row["throughput"]] == [1, 2], row
    assert all(got["consumed"] == 4 and got["jobs_per_s"] > 0 for got in row["throughput"]), row
    assert row["latency"]["samples"] == 2 and row["latency"]["median_ms"] > 0, row
    assert row["failover"]["completed"] is True, row


def test_the_jobs_benchmark_reports_each_measurement_on_redis(redis_url: str) -> None:
    report = run_benchmark("--backends", "redis", "--redis", redis_url)
    check_measurements(report["results"]["redis"])
    assert "latency_median_taskflow_over_flowengine" in report["ratios"]
    assert all(got["consumed"] == 4 for got in report["taskflow_redis"]["throughput"])
    assert boards.redis_keys(redis_url, f"flowengine-bench:{report['run']}:") == []


def test_the_jobs_benchmark_runs_on_zookeeper_and_etcd_and_cleans_up(
    zookeeper_hosts: str, etcd_endpoint: tuple[str, int],
) -> None:
    host, port = etcd_endpoint
    report = run_benchmark("--backends", "zookeeper,etcd", "--zookeeper", zookeeper_hosts,
                           "--etcd", f"{host}:{port}")
    check_measurements(report["results"]["zookeeper"])
    check_measurements(report["results"]["etcd"])
    assert "taskflow_redis" not in report
    assert not boards.zookeeper_exists(zookeeper_hosts, f"/flowengine-bench/{report['run']}")
    assert boards.etcd_keys(etcd_endpoint, f"flowengine-bench/{report['run']}/") == []
