"""Run the persistence and resumption examples as a user would, and check the lines that matter.

They need no server: each keeps a SQLite file in a temporary directory. Two of them start a
process that is killed with SIGKILL, then resume its flows from the database. The persistence
benchmark runs too, with tiny sizes, to check the JSON it prints.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str, folder: pathlib.Path = EXAMPLES) -> str:
    env = dict(os.environ, PYTHONIOENCODING="utf-8", NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(folder / script), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8", timeout=60,
    )
    assert proc.returncode == 0, (
        f"{script} exited with {proc.returncode}\n--- stdout\n{proc.stdout}\n"
        f"--- stderr\n{proc.stderr}"
    )
    return proc.stdout


def assert_in_order(output: str, patterns: list[str]) -> None:
    """Each regex matches a whole line (stripped) somewhere after the previous match."""
    lines = [line.strip() for line in output.splitlines()]
    position = 0
    for pattern in patterns:
        for index in range(position, len(lines)):
            if re.fullmatch(pattern, lines[index]):
                position = index + 1
                break
        else:
            raise AssertionError(f"no line matching {pattern!r} (in order)\n--- output\n{output}")


def test_assert_in_order_rejects_lines_out_of_order() -> None:
    with pytest.raises(AssertionError):
        assert_in_order("b\na\n", ["a", "b"])


def test_persistence_sqlite_shows_every_stored_change_and_record() -> None:
    output = _run("persistence_sqlite.py")
    assert_in_order(output, [
        r"stored flow place-order: PENDING -> RUNNING",
        r"stored reserve: PENDING -> RUNNING",
        r"stored reserve: RUNNING -> SUCCESS",
        r"stored ship: RUNNING -> SUCCESS",
        r"stored flow place-order: RUNNING -> SUCCESS",
        r"logbook 'orders': 1 flow detail\(s\)",
        r"flow detail 'place-order': state SUCCESS",
        r"reserve +SUCCESS +intention=EXECUTE +results='reservation-book'",
        r"charge +SUCCESS +intention=EXECUTE +results=\{'charged': 30, 'currency': 'EUR'\}",
        r"ship +SUCCESS +intention=EXECUTE +results='parcel for reservation-book'",
        r"_TaskFlow_INJECTOR +SUCCESS +intention=EXECUTE +results=\{'item': 'book', 'amount': 30\}",
        r"== the atomdetails table",
        r'reserve +SUCCESS +"reservation-book"',
    ])


def test_resume_after_crash_reruns_exactly_the_tasks_in_flight() -> None:
    output = _run("resume_after_crash.py")
    assert_in_order(output, [
        r"\| finished transform",
        r"first process ended by signal SIGKILL",
        r"in flight at the crash: load_asia, load_eu, load_us",
        r"stored states: extract=SUCCESS, transform=SUCCESS, load_eu=RUNNING, load_us=RUNNING, "
        r"load_asia=RUNNING, publish=PENDING",
        r"flow state: SUCCESS",
        r"publish result: 3331",
        r"ran again: load_asia, load_eu, load_us",
        r"ran for the first time: publish",
        r"not run again: extract, transform",
        r"the tasks that ran again are exactly the ones in flight at the crash",
    ])
    resumed = output.split("== resuming", 1)[1]
    assert "started extract" not in resumed and "started transform" not in resumed, output


def test_resume_many_finds_and_resumes_every_unfinished_flow() -> None:
    output = _run("resume_many.py")
    assert_in_order(output, [
        r"\| order-4: ship",
        r"first process ended by signal SIGKILL",
        r"order-1 +SUCCESS",
        r"order-2 +REVERTED",
        r"order-3 +SUSPENDED",
        r"order-4 +RUNNING",
        r"order-5 +never started",
        r"unfinished flows: order-3, order-4, order-5",
        r"== resuming order-3 \(was SUSPENDED\)",
        r"order-3: charge",
        r"== resuming order-4 \(was RUNNING\)",
        r"order-4: ship",
        r"order-4: notify",
        r"== resuming order-5 \(was never started\)",
        r"order-5: reserve",
        r"== stored flow states after resuming",
        r"order-3 +SUCCESS",
        r"order-4 +SUCCESS",
        r"order-5 +SUCCESS",
        r"unfinished flows: 0",
    ])
    resumed = output.split("unfinished flows: order-3", 1)[1]
    # Finished steps are not repeated: order-3 had reserved, order-4 had reserved and charged.
    for done in ("order-3: reserve", "order-4: reserve", "order-4: charge", "order-1:",
                 "order-2:"):
        assert done not in resumed, f"{done!r} ran again after resuming\n{output}"


def test_persistence_benchmark_prints_its_json(tmp_path: pathlib.Path) -> None:
    output = _run("persistence.py", "--size", "4", "--repeat", "2", "--postgres", "",
                  "--workdir", str(tmp_path), folder=ROOT / "benchmarks")
    report = json.loads(output)
    assert report["benchmark"] == "persistence"
    assert report["flow"] == "linear, 4 no-op tasks, serial engine"
    assert report["repeat"] == 2 and isinstance(report["target_met"], bool)
    results = report["results"]
    assert sorted(results) == ["memory", "none", "sqlite"]  # PostgreSQL skipped by ''
    for name, row in results.items():
        assert row["run_s"] > 0 and row["load_s"] > 0, name
        assert len(row["run_s_all"]) == 2, name
        assert round(row["run_s"], 4) == min(row["run_s_all"]), name
        assert row["run_s_median"] >= row["run_s"], name
        assert row["ratio_to_none"] == round(row["run_s"] / results["none"]["run_s"], 2)
    assert report["target_met"] == (results["sqlite"]["ratio_to_memory"] <= 3.0)
    statements = report["sqlite_statements"]
    assert statements["atom_state_changes"] == 8
    assert statements["during_run"].get("UPDATE", 0) >= 8
    assert statements["statements_per_atom_state_change"] > 0
