"""Running ``flowengine rehearse`` as a user does, from examples/, and reading its matrix."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: Exit code of a rehearsal with a finding (flowengine.cli.exits.FINDINGS).
FINDINGS = 8


def rehearse(spec: str, *options: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``flowengine rehearse SPEC OPTIONS`` from examples/ (where the example modules are)."""
    return subprocess.run([sys.executable, "-m", "flowengine.cli.main", "rehearse", spec,
                           *options], cwd=EXAMPLES, capture_output=True, text=True,
                          timeout=timeout)


def matrix(output: str) -> dict[str, list[str]]:
    """The matrix's rows by failure point: the cells, the flow's end and the verdict."""
    rows: dict[str, list[str]] = {}
    for line in output.splitlines():
        if line.startswith(("fail ", "no fault", "every revert")):
            label, _, rest = line.partition("  ")
            rows[label.strip()] = rest.split()
    return rows


def flagged(output: str) -> list[str]:
    """The finding lines of the verdict."""
    return [line.strip() for line in output.splitlines() if line.startswith("  ")
            and ": " in line and not line.startswith("   ")]


BOOKING_ROWS = {
    "no fault (baseline)": ["E", "E", "E", "SUCCESS", "ok"],
    "fail execute of reserve_seat": ["x/R", ".", ".", "REVERTED", "ok"],
    "fail execute of charge_card": ["E/R", "x/R", ".", "REVERTED", "ok"],
    "fail execute of send_ticket": ["E/R", "E/R", "x/R", "REVERTED", "ok"],
    "fail revert of reserve_seat": ["E/X", "E/R", "x/R", "FAILURE", "ok"],
    "fail revert of charge_card": ["E", "E/X", "x/R", "FAILURE", "ok"],
    "fail revert of send_ticket": ["E", "E", "x/X", "FAILURE", "ok"],
}


def check_booking(proc: subprocess.CompletedProcess[str], fixed: bool,
                  stage: Sequence[str] = ()) -> None:
    """The booking example's matrix: the buggy flow flagged at charge_card alone, in the
    twice row alone; the fixed one clean."""
    output = proc.stdout
    rows = matrix(output)
    for label, cells in BOOKING_ROWS.items():
        assert rows[label] == cells, (label, output, proc.stderr)
    if fixed:
        assert proc.returncode == 0, output + proc.stderr
        assert rows["every revert twice"] == ["E/R+R", "E/R+R", "x/R+R", "REVERTED", "ok"]
        assert "no finding: every failure point is undone safely" in output
    else:
        assert proc.returncode == FINDINGS, output + proc.stderr
        assert rows["every revert twice"] == ["E/R+R", "E/R+R!", "x/R+R", "REVERTED", "FINDING"]
        assert flagged(output) == [
            "every revert twice: charge_card: revert not idempotent: its second revert "
            "changed balance from 0 to 120"], output
    for part in stage:
        assert part in output, output
