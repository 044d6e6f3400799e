"""Mixed fleets: a TaskFlow engine on flowengine workers, a flowengine engine on TaskFlow workers.

Both sides are the real libraries in their own processes (``taskflow`` 6.x is a test-only
dependency): the worker is a ``flowengine worker --taskflow-compat`` or TaskFlow's own worker
module, the engine runs in ``interop_engine.py``. Both import ``interop_tasks``, each with its own
library's ``Task`` base. Each engine runs an order flow to success, then again with its last
task failing, and the flow reverts: the results, the failure's type and message, the revert
order and what each revert received must be what a single-library deployment gives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from wbe_harness import HERE, REPO, Broker, subprocess_env

pytestmark = pytest.mark.integration

TOPIC = "orders"
#: Seconds the engine process gets for both runs.
ENGINE_TIMEOUT = 120.0

RESERVATION = {"id": "rsv-widget-2", "quantity": 2}
RECEIPT = "rcpt-rsv-widget-2-19.98"
TRACKING = f"trk-{RECEIPT}"
SHIP_ERROR = f"cannot ship {RECEIPT}"


def run_engine(library: str, broker: Broker, exchange: str, ledger: Path) -> dict[str, Any]:
    """Run ``interop_engine.py`` with ``library``'s engine; return what it printed."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "interop_engine.py"), library, broker.url, exchange, TOPIC],
        cwd=REPO, env=subprocess_env({"INTEROP_LEDGER": str(ledger)}), capture_output=True,
        text=True, timeout=ENGINE_TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, f"{library} engine failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def check(outcome: dict[str, Any], ledger: list[dict[str, Any]], worker_library: str,
          worker_pid: int) -> None:
    success, failure = outcome["success"], outcome["failure"]
    assert success["raised"] is None, success
    assert success["state"] == "SUCCESS"
    assert success["results"] == {"reserve": RESERVATION, "charge": RECEIPT, "ship": TRACKING}
    assert success["progress"] == [0.0, 0.5, 1.0]  # start, the task's own report, end

    assert failure["state"] == "REVERTED"
    assert failure["atoms"] == {"reserve": "REVERTED", "charge": "REVERTED", "ship": "REVERTED"}
    raised = failure["raised"]
    assert raised["type"] == "WrappedFailure", raised  # a remote failure is data in both
    [carried] = raised["failures"]
    assert carried["message"] == SHIP_ERROR
    assert carried["types"][:2] == ["interop_tasks.ShippingError", "RuntimeError"], carried

    # Every action ran on the worker, in the worker's library.
    assert {(e["library"], e["pid"]) for e in ledger} == {(worker_library, worker_pid)}
    steps = [(e["event"], e["atom"]) for e in ledger]
    assert steps == [
        ("execute", "reserve"), ("execute", "charge"), ("execute", "ship"),  # success run
        ("execute", "reserve"), ("execute", "charge"), ("execute", "ship"),  # failing run
        ("revert", "ship"), ("revert", "charge"), ("revert", "reserve"),
    ]
    reverts = {e["atom"]: e for e in ledger if e["event"] == "revert"}
    # What each revert received crossed the wire from the other library intact.
    assert reverts["reserve"]["result"] == RESERVATION
    assert reverts["charge"]["result"] == RECEIPT
    assert reverts["ship"]["result"]["failure"] == SHIP_ERROR
    assert reverts["ship"]["result"]["types"][0] == "interop_tasks.ShippingError"
    for entry in reverts.values():
        assert entry["failures"] == {"ship": SHIP_ERROR}, entry


def test_taskflow_engine_runs_on_flowengine_workers(broker: Broker, exchange: str,
                                                    fleet_factory: Any, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    fleet = fleet_factory(broker, exchange, taskflow_compat=True, env={
        "INTEROP_LEDGER": str(ledger), "INTEROP_TASK_LIBRARY": "flowengine"})
    [worker] = fleet.start(TOPIC, ["interop_tasks"], threads=2)
    outcome = run_engine("taskflow", broker, exchange, ledger)
    check(outcome, read_ledger(ledger), "flowengine", worker.pid)


def test_flowengine_engine_runs_on_taskflow_workers(broker: Broker, exchange: str,
                                                    fleet_factory: Any, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    fleet = fleet_factory(broker, exchange, taskflow_compat=True, env={
        "INTEROP_LEDGER": str(ledger), "INTEROP_TASK_LIBRARY": "taskflow"})
    worker = fleet.start_taskflow(TOPIC, ["interop_tasks"])
    outcome = run_engine("flowengine", broker, exchange, ledger)
    check(outcome, read_ledger(ledger), "taskflow", worker.pid)
