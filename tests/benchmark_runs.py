"""Running a benchmark script as its users do, for the tests that keep the benchmarks working.

A benchmark prints one JSON document on stdout (progress on stderr); the tests run each at a
tiny size and check the report's shape, never its numbers (speed is never asserted).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def run_benchmark(script: str, *args: str, env: dict[str, str] | None = None,
                  timeout: float = 120.0) -> dict[str, Any]:
    """The JSON report ``benchmarks/<script>`` printed when run with ``args``; it must succeed."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    return report
