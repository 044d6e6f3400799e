"""``flowengine chaos`` on real brokers, as a user runs it: the example order flow is certified
on flowengine workers on Redis and on RabbitMQ; on TaskFlow 6 workers (which acknowledge a
request on receipt and hold no lease) the same schedule leaves flows hung, and it says so.

CI runs each for 25 seconds of chaos (the 120-second runs are made by hand; doc/proving.rst
gives their figures). Each session's work folder (store, logs, every process's output) is in
the test's tmp_path, quoted when it fails.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from wbe_harness import Broker, delete_exchange

# Each run is 25 s of chaos, then the flows settle and are judged: 60-120 s on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
#: Seconds of chaos in CI; the seed fixes the schedule (every kind of fault in its first four).
DURATION = 25
SEED = 7
#: Exit code of an uncertified flow (flowengine.cli.exits.FINDINGS).
NOT_CERTIFIED = 8


def chaos(broker: Broker, exchange: str, workdir: pathlib.Path, *options: str,
          settle: float = 60) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "flowengine.cli.main", "chaos", "chaos_orders:order_flow",
         "--duration", str(DURATION), "--workers", "3", "--seed", str(SEED), "--url",
         broker.url, "--exchange", exchange, "--workdir", str(workdir), "--settle",
         str(settle), "--json", *options],
        cwd=EXAMPLES, capture_output=True, text=True, timeout=DURATION + settle + 180)
    try:
        certificate = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no certificate:\n{proc.stdout}\n{proc.stderr}") from None
    return proc.returncode, certificate, proc.stderr


@pytest.mark.parametrize("name", ["redis", "rabbitmq"])
def test_the_order_flow_is_certified_on_flowengine_workers(
        name: str, request: pytest.FixtureRequest, exchange: str,
        tmp_path: pathlib.Path) -> None:
    broker: Broker = request.getfixturevalue(f"{name}_broker")
    try:
        code, certificate, said = chaos(broker, exchange, tmp_path / "chaos")
    finally:
        delete_exchange(broker.url, exchange, [f"{exchange}_chaos"])
    assert code == 0 and certificate["passed"], (certificate, said)
    kinds = {fault["kind"] for fault in certificate["faults"]}
    assert kinds == {"kill-worker", "freeze-worker", "restart-worker", "restart-engine"}
    assert certificate["flows"] >= 20
    assert set(certificate["ended"]) == {"SUCCESS", "REVERTED"}  # every 7th order declined
    assert certificate["hung"] == [] and certificate["reran"] == []
    assert any(fault["affected"] for fault in certificate["faults"]), certificate
    assert certificate["worst_recovery"] is not None
    assert f"--seed {SEED}" in certificate["replay"]
    print(f"{name}: {json.dumps(certificate)}")  # the figures, for whoever reads the log


def test_taskflow_workers_leave_flows_hung_and_chaos_says_so(
        redis_broker: Broker, exchange: str, tmp_path: pathlib.Path) -> None:
    try:
        code, certificate, said = chaos(redis_broker, exchange, tmp_path / "chaos",
                                        "--taskflow-compat", settle=30)
    finally:
        delete_exchange(redis_broker.url, exchange, [f"{exchange}_chaos"])
    assert code == NOT_CERTIFIED and not certificate["passed"], (certificate, said)
    # A killed TaskFlow worker took its requests with it (acknowledged on receipt) and the
    # engine holds no lease on them: their flows never end.
    assert certificate["hung"], certificate
    assert all("still RUNNING" in line for line in certificate["hung"])
    assert any(fault["recovery"] is None for fault in certificate["faults"]
               if fault["kind"] in ("kill-worker", "restart-worker")), certificate
    print(f"taskflow: {json.dumps(certificate)}")
