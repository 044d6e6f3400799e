"""Runs examples/wbe_many_flows.py: fifty engines at once share one broker client."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_wbe_many_flows() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples")]))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "wbe_many_flows.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "order 7: SUCCESS trk-rsv-widget-7-1" in lines, proc.stdout
    assert "flows: 50, succeeded: 50" in lines
    assert "broker clients in this process: 1" in lines
    assert "reply consumer threads: 1" in lines
