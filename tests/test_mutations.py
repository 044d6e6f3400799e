"""``tests/mutations.py`` keeps working: every break still applies, and one runs end to end.

The script is run by hand (see doc/testing.rst); this keeps it from rotting as the product
changes under it. A break whose line was rewritten must be rewritten with it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mutations  # tests/ is on sys.path (rootdir conftest)
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("item", mutations.BREAKS, ids=lambda item: item.name)
def test_every_break_still_applies_to_the_code(item: mutations.Break) -> None:
    assert item.problem() is None, f"break {item.name!r}: {item.problem()}"


def test_breaks_cover_every_area_and_have_distinct_names() -> None:
    names = [item.name for item in mutations.BREAKS]
    assert len(names) == len(set(names))
    assert {item.area for item in mutations.BREAKS} == {
        "engine", "storage", "worker-based", "jobs", "dashboard", "cli"}


@pytest.mark.timeout(180)  # a copy of the tree and a pytest run: 6 s alone, 30 s under load
def test_a_break_is_run_on_a_scratch_copy_and_its_catching_test_named(tmp_path: Path) -> None:
    before = (ROOT / "flowengine" / "cli" / "exits.py").read_text()
    report = tmp_path / "outcomes.json"
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "mutations.py"), "--only",
                           "cli-reverted-exits-0", "--json", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [outcome] = json.loads(report.read_text())
    assert outcome["verdict"] == mutations.CAUGHT, outcome
    assert outcome["caught_by"].startswith("tests/unit/test_cli_run.py::"), outcome
    assert "cli-reverted-exits-0" in done.stdout and "caught" in done.stdout
    assert (ROOT / "flowengine" / "cli" / "exits.py").read_text() == before, (
        "the break was applied to the real tree, not a copy")


def test_outcomes_are_judged_from_pytest_output() -> None:
    assert mutations.judge(0, "1 passed") == (mutations.PASSED, "", "")
    failed = "...\nFAILED tests/unit/test_x.py::test_y - AssertionError\n1 failed"
    assert mutations.judge(1, failed) == (mutations.CAUGHT, "tests/unit/test_x.py::test_y", "")
    timed_out = ("tests/unit/test_x.py::test_ok PASSED\ntests/unit/test_x.py::test_hangs "
                 "\n" + "+" * 20 + " Timeout " + "+" * 20 + "\n~~ Stack of MainThread ~~\n")
    verdict, caught_by, _ = mutations.judge(1, timed_out)
    assert (verdict, caught_by) == (mutations.TIMED_OUT, "tests/unit/test_x.py::test_hangs")
