"""Run ``benchmarks/locks.py`` with a tiny size on every backend and check its report's shape.

Speed is never asserted; this only makes sure the benchmark keeps working and cleans up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boards
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration]


def test_the_locks_benchmark_measures_each_backend_and_cleans_up(
        redis_url: str, zookeeper_hosts: str, etcd_endpoint: tuple[str, int]) -> None:
    host, port = etcd_endpoint
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "locks.py"), "--samples", "3", "--redis",
         redis_url, "--zookeeper", zookeeper_hosts, "--etcd", f"{host}:{port}"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert sorted(report["results"]) == ["etcd", "redis", "zookeeper"]
    for measured in report["results"].values():
        for what in ("acquire", "release", "handover"):
            assert measured[what]["samples"] == 3 and measured[what]["median_ms"] > 0, measured
    assert boards.redis_keys(redis_url, f"{report['run']}:") == []
    assert not boards.zookeeper_exists(zookeeper_hosts, f"/{report['run']}")
