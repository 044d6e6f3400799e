"""Run the tracing cost benchmark with tiny sizes and check the shape of its JSON (never speed)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_tracing_cost_reports_every_mode_and_the_hooks_cost_when_off() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tracing_cost.py"), "--serial", "10",
         "--remote", "5", "--repeat", "1", "--hook-calls", "100"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["benchmark"] == "tracing_cost"
    for workload, spans_per_task in (("serial", 1 + 1 / 10), ("worker_based", 3 + 1 / 5)):
        modes = report[workload]
        assert modes["absent"]["ratio"] == 1.0
        # Only the recording provider exports: one span per atom (three remotely) and the flow.
        assert [modes[m]["spans_per_task"] for m in ("absent", "no_provider", "not_sampled")] == [
            0, 0, 0]
        assert abs(modes["on"]["spans_per_task"] - spans_per_task) < 1e-9, modes
    assert set(report["hooks_off"]) == {
        f"{hook}_{mode}_ns" for hook in ("flow_run", "task_scope", "request_sent", "serving",
                                         "replied") for mode in ("absent", "no_provider")}
    assert set(report["sdk_span_alone"]) == {"not_sampled_us", "on_us"}
