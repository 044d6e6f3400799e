"""The user-style test suite in examples/testkit runs, as its team would run it: ``pytest``
over the folder, with the test kit's plugin enabled by the folder's ``conftest.py``."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "testkit"
TESTS = ["test_an_order_goes_through", "test_a_busy_gateway_is_tried_again_an_hour_later",
         "test_a_worker_lost_after_charging_does_not_charge_twice",
         "test_a_failed_shipment_refunds_and_releases",
         "test_refunds_and_releases_are_idempotent",
         "test_a_courier_that_never_answers_times_out_after_an_hour"]


def test_the_order_services_suite_passes_on_the_test_kit() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--durations=0",
         "--rootdir", str(SUITE), str(SUITE)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in TESTS:
        assert f"test_orders.py::{name} PASSED" in proc.stdout, proc.stdout
    # Each test's time is printed (--durations) for whoever reads the log; none is asserted.
    print(proc.stdout[proc.stdout.find("slowest durations"):])
