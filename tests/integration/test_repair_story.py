"""The repair story, as an operator lives it: every step a ``flowengine`` process of its own.

Task B's revert fails while a fault file exists, so the flow ends FAILURE. Once the file is
gone, ``flowengine repair --retry-reverts`` runs B's revert once, then A's, and the flow ends
REVERTED with the repair listed by ``flowengine show``. And a repair of a flow another process
still runs is refused, naming that process. The tasks' ledger says what ran.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import stopping_flows as sf
from fault_support import WAIT, wait_until
from wbe_harness import REPO, subprocess_env

from flowengine.engines import suspend_requests as sr
from flowengine.persistence import backends

pytestmark = pytest.mark.integration


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "flowengine.cli.main", *args]


def _flowengine(ledger: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(*args), cwd=REPO, env=subprocess_env({sf.LEDGER_ENV: str(ledger)}),
                          capture_output=True, text=True, timeout=WAIT * 2)


def _flow_id(out: str) -> str:
    return out.splitlines()[0].split("(", 1)[1].split(")", 1)[0]


def _events(ledger: Path, since: int = 0) -> list[tuple[str, str]]:
    return [(line["event"], line["atom"]) for line in sf.read(ledger)[since:]]


def test_a_failed_revert_is_retried_once_its_cause_is_fixed(tmp_path: Path) -> None:
    ledger, fault = tmp_path / "ledger.jsonl", tmp_path / "fault"
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    fault.touch()
    failed = _flowengine(ledger, "run", "stopping_flows:revert_fault", "--kwarg",
                         f"fault={fault}", "--backend", uri, "--plain")
    assert failed.returncode == 4, failed.stdout + failed.stderr
    flow = _flow_id(failed.stdout)
    assert _events(ledger) == [("execute", "A"), ("execute", "B"), ("execute", "C"),
                               ("revert", "C"), ("revert-failed", "B")]
    stuck = _flowengine(ledger, "show", flow, "--backend", uri)
    assert stuck.stdout.splitlines()[0] == f"flow revert-fault ({flow}): FAILURE"

    fault.unlink()
    before = len(sf.read(ledger))
    repaired = _flowengine(ledger, "repair", flow, "--retry-reverts", "--reason",
                           "the storage array is back", "--backend", uri)
    assert repaired.returncode == 3, repaired.stdout + repaired.stderr
    assert _events(ledger, before) == [("revert", "B"), ("revert", "A")]
    assert sf.read(ledger)[before]["result"] == "B-resource"  # what B's execute returned
    shown = _flowengine(ledger, "show", flow, "--backend", uri).stdout.splitlines()
    assert shown[0] == f"flow revert-fault ({flow}): REVERTED"
    [listed] = [line for line in shown if "retry-reverts" in line]
    assert listed.endswith("(flowengine repair): the storage array is back (atoms: B)"), listed


def test_a_flow_still_running_elsewhere_is_not_repaired(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    with open(tmp_path / "run.log", "w") as log:
        running = subprocess.Popen(
            _argv("run", "stopping_flows:five", "--backend", uri, "--plain"), cwd=REPO,
            env=subprocess_env({sf.LEDGER_ENV: str(ledger)}), stdout=log,
            stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: ("execute", "s3") in _events(ledger), WAIT, "task 3 running",
                   details=lambda: (tmp_path / "run.log").read_text())
        flow = _flow_id((tmp_path / "run.log").read_text())
        with backends.backend(uri) as backend:
            conn = backend.get_connection()
            assert sr.META_RUNNING_ON in conn.get_flow_details(flow).meta
            conn.close()
        refused = _flowengine(ledger, "repair", flow, "--mark-reverted", "s2", "--reason",
                              "deleted by hand", "--backend", uri)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"is held by its SerialActionEngine in pid {running.pid} on " in refused.stderr
        assert ("revert", "s2") not in _events(ledger)
        cancelled = _flowengine(ledger, "cancel", flow, "--reason", "test over",
                                "--backend", uri, "--wait", str(WAIT))
        assert cancelled.returncode == 7, cancelled.stdout + cancelled.stderr
        assert running.wait(WAIT) == 7
        assert [e for e in _events(ledger) if e[0] == "revert"] == [
            ("revert", "s3"), ("revert", "s2"), ("revert", "s1")]
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
