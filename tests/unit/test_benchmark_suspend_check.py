"""benchmarks/suspend_check.py at a tiny size: the report has its shape (speed is not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_reports_each_variant() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "suspend_check.py"), "--atoms", "20",
         "--rounds", "1"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["benchmark"] == "suspend_check" and report["atoms"] == 20
    assert set(report["serial_sqlite"]) == {"off", "default", "every_transition"}
    assert report["ratio_to_off"]["off"] == 1.0
