"""benchmarks/dashboard.py at a tiny size: the report has its shape (speed is never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_reports_pages_and_push_delay() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dashboard.py"), "--flows", "300",
         "--atoms", "30", "--repeat", "1", "--events", "3"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["benchmark"] == "dashboard" and report["stored_flows"] == 302
    assert set(report["pages"]) == {"big_flow_page_cold_ms", "flows_first_page",
                                    "flows_filtered", "flows_deep_page_offset",
                                    "flows_deep_page_keyset", "flows_page_1000",
                                    "small_flow_page", "big_flow_page"}
    assert report["deep_page"] == 6
    assert report["push_delay"]["events"] == 3
    assert isinstance(report["target"]["met"], bool)
