"""examples/dashboard_app.py runs, and the pages it reads say what the docs promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dashboard_example() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "dashboard_app.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for expected in ("flows page lists 2 flows",
                     "failed flow's atoms: charge=REVERTED, reserve=REVERTED",
                     "graph links drawn: 1", "failure shown: True", "card number shown: False"):
        assert expected in lines, proc.stdout
