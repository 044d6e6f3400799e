"""A concurrency limit across processes: ten flows, a limit of three, real servers.

Two processes run five flows each at once; every flow's ``RebootHost`` task counts against one
limit of 3 held on Redis, ZooKeeper or etcd. The ledger of starts and ends shows that never
more than three ran at once, and that all ten ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lock_flows
import pytest
from conductor_procs import ROOT
from coordination_stage import coordination_conf

# Two processes of five flows each; about 5 s on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
__all__ = ["coordination_conf"]

HERE = Path(__file__).resolve().parent


def _most_at_once(ledger: Path) -> int:
    events = sorted((line.at, 1 if line.event == "start" else -1)
                    for line in lock_flows.lines(ledger))
    running = most = 0
    for _at, change in sorted(events, key=lambda e: (e[0], e[1])):  # ends first on a tie
        running += change
        most = max(most, running)
    return most


def test_ten_flows_with_a_limit_of_three_never_run_more_than_three(coordination_conf: str,
                                                                   tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT),
                                                         os.environ.get("PYTHONPATH", "")])}
    children = [subprocess.Popen([sys.executable, str(HERE / "limit_child.py"), coordination_conf,
                                  str(ledger), label, "5", "3"], env=env,
                                 stderr=subprocess.PIPE, text=True)
                for label in ("left", "right")]
    for child in children:
        _out, err = child.communicate(timeout=90)
        assert child.returncode == 0, err
    lines = lock_flows.lines(ledger)
    assert sorted({line.job for line in lines}) == sorted(
        f"{label}-{i}" for label in ("left", "right") for i in range(5))
    assert len({line.pid for line in lines}) == 2
    assert _most_at_once(ledger) == 3, lines
