"""``flowengine rehearse`` on the example flows: the booking flow whose refund is not idempotent
is flagged at exactly that task and exits 8; the fixed flow and the README's flow pass. On the
serial engine, on the worker-based engine with workers in the process, and on worker processes
(the embedded filesystem transport here; Redis and RabbitMQ in tests/integration).
"""

from __future__ import annotations

import json

import pytest
from rehearse_cli import FINDINGS, check_booking, flagged, matrix, rehearse

# Each runs `flowengine rehearse` (a dozen runs of a flow, real worker processes in some):
# 5-40 s on a loaded machine.
pytestmark = pytest.mark.timeout(300)

SEAT = ["--store", "seat=12A"]


@pytest.mark.parametrize("fixed", [False, True], ids=["buggy", "fixed"])
def test_rehearse_on_the_serial_engine(fixed: bool) -> None:
    spec = "rehearse_booking:fixed_booking" if fixed else "rehearse_booking:booking"
    check_booking(rehearse(spec, *SEAT), fixed, stage=["8 runs on the serial engine"])


@pytest.mark.parametrize("fixed", [False, True], ids=["buggy", "fixed"])
def test_rehearse_on_the_worker_based_engine_in_process(fixed: bool) -> None:
    spec = "rehearse_booking:fixed_booking" if fixed else "rehearse_booking:booking"
    check_booking(rehearse(spec, *SEAT, "--engine", "worker-based"), fixed,
                  stage=["workers in this process (memory transport)"])


@pytest.mark.parametrize("fixed", [False, True], ids=["buggy", "fixed"])
def test_rehearse_on_worker_processes(fixed: bool) -> None:
    spec = "rehearse_booking:fixed_booking" if fixed else "rehearse_booking:booking"
    check_booking(rehearse(spec, *SEAT, "--engine", "worker-based", "--workers", "2"), fixed,
                  stage=["2 worker process(es) on flowengine-fs"])


@pytest.mark.parametrize("engine", [["--engine", "serial"], ["--engine", "worker-based"],
                                    ["--engine", "worker-based", "--workers", "2"]],
                         ids=["serial", "worker-based", "worker-processes"])
def test_the_readme_flow_passes(engine: list[str]) -> None:
    proc = rehearse("readme_booking:flow", *SEAT, *engine)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = matrix(proc.stdout)
    assert rows["every revert twice"][-2:] == ["REVERTED", "ok"]
    assert flagged(proc.stdout) == []


def test_a_revert_that_undoes_what_never_happened_is_flagged() -> None:
    proc = rehearse("rehearse_careless:booking", *SEAT)
    assert proc.returncode == FINDINGS, proc.stdout + proc.stderr
    assert flagged(proc.stdout) == [
        "fail execute of charge_card: charge_card: revert assumes its execute ran: its "
        "execute never completed, yet its revert changed balance from None to 120",
        # Refunding unconditionally, it also refunds twice when run twice.
        "every revert twice: charge_card: revert not idempotent: its second revert changed "
        "balance from 0 to 120"]


def test_json_report_and_bad_input() -> None:
    proc = rehearse("rehearse_booking:booking", *SEAT, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == FINDINGS and report["safe"] is False
    assert [r["point"] for r in report["runs"] if r["findings"]] == ["every revert twice"]
    missing = rehearse("rehearse_booking:nothing")
    assert missing.returncode == 1 and "has no attribute 'nothing'" in missing.stderr
    usage = rehearse("rehearse_booking:booking", "--workers", "2")
    assert usage.returncode == 2 and "--workers needs --engine worker-based" in usage.stderr
