"""A concurrency limit held by worker processes (``flowengine worker --limit Reboot=2``).

Two workers of three threads each serve six flows at once; at most two ``Reboot`` requests run
at once across both, the others wait at the worker unstarted, shown as waiting to their engines
(and to ``flowengine locks``), and every flow ends.
"""

from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wbe_harness import Broker, WorkerFleet, subprocess_env

from flowengine import engines
from flowengine.flows import linear_flow
from flowengine.storage import META_PROGRESS_DETAILS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "reboots"
FLOWS = 6


@pytest.fixture
def coordination_url(redis_url: str) -> Iterator[str]:
    namespace = f"fe-limits-{uuid.uuid4().hex[:10]}"
    yield f"{redis_url}?namespace={namespace}"
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def _progress_details(engine: Any) -> dict[str, Any]:
    """The details of the last progress its ``reboot`` task reported."""
    storage = engine.storage
    try:
        detail = storage.flow_detail.find(storage.get_atom_uuid("reboot"))
    except Exception:  # noqa: BLE001 - not prepared yet
        return {}
    stored = (detail.meta or {}).get(META_PROGRESS_DETAILS) if detail is not None else None
    return dict((stored or {}).get("details") or {})


def _wait_until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # other processes and threads: nothing to wait on
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s"
        time.sleep(0.05)


def test_workers_run_at_most_their_limit_at_once_and_show_the_rest_waiting(
        rabbitmq_broker: Broker, exchange: str, fleet_factory: Callable[..., WorkerFleet],
        coordination_url: str, tmp_path: Path) -> None:
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    fleet = fleet_factory(rabbitmq_broker, exchange,
                          env={"LIMIT_LEDGER": str(ledger), "LIMIT_GATE": str(gate)})
    fleet.start(TOPIC, ["limit_tasks:Reboot"], count=2, threads=3,
                extra_args=["--limit", "Reboot=2", "--coordination", coordination_url])
    import os

    os.environ["LIMIT_LEDGER"], os.environ["LIMIT_GATE"] = str(ledger), str(gate)
    import limit_tasks

    loaded = [engines.load(linear_flow.Flow(f"f{i}").add(limit_tasks.Reboot("reboot")),
                           store={"flow": f"f{i}"},
                           **fleet.engine_options(TOPIC, engine="worker-based"))
              for i in range(FLOWS)]
    pool = cf.ThreadPoolExecutor(max_workers=FLOWS)
    try:
        runs = [pool.submit(engine.run) for engine in loaded]
        _wait_until(lambda: len(ledger.read_text().splitlines()) == 2 if ledger.exists()
                    else False, "two reboots running")
        _wait_until(lambda: sum(1 for e in loaded
                                if _progress_details(e).get("waiting_for")) == FLOWS - 2,
                    "the other four shown waiting")
        waiting = [_progress_details(e)["waiting_for"] for e in loaded
                   if _progress_details(e).get("waiting_for")]
        assert {(w["key"], w["kind"], w["limit"]) for w in waiting} == {("Reboot", "limit", 2)}
        listed = subprocess.run(
            [sys.executable, "-m", "flowengine.cli.main", "locks", "--board", coordination_url,
             "--json"], capture_output=True, text=True, timeout=60, env=subprocess_env())
        import json

        states = sorted(row["state"] for row in json.loads(listed.stdout))
        assert states == ["held", "held", "waiting", "waiting", "waiting", "waiting"], listed
        gate.touch()
        for run in runs:
            run.result(timeout=120)
    finally:
        gate.touch()
        pool.shutdown(wait=True)
    lines = [line.split() for line in ledger.read_text().splitlines()]
    assert sorted({flow for _, flow, _, _ in lines}) == [f"f{i}" for i in range(FLOWS)]
    running = most = 0
    for event, *_ in sorted(lines, key=lambda line: (float(line[3]), line[0] == "start")):
        running += 1 if event == "start" else -1
        most = max(most, running)
    assert most == 2, lines
    # Once started, none shows waiting any more.
    assert all(not _progress_details(e).get("waiting_for") for e in loaded)


def test_a_worker_based_engine_holds_its_flow_lock_and_task_limits(
        rabbitmq_broker: Broker, exchange: str, fleet_factory: Callable[..., WorkerFleet],
        coordination_url: str, tmp_path: Path) -> None:
    import os

    from flowengine import coordination

    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    os.environ["LIMIT_LEDGER"], os.environ["LIMIT_GATE"] = str(ledger), str(gate)
    fleet = fleet_factory(rabbitmq_broker, exchange,
                          env={"LIMIT_LEDGER": str(ledger), "LIMIT_GATE": str(gate)})
    fleet.start(TOPIC, ["limit_tasks:Reboot"])
    import limit_tasks

    engine = engines.load(linear_flow.Flow("locked").add(limit_tasks.Reboot("reboot")),
                          store={"flow": "locked"}, locks=["lb:1"],
                          coordination=coordination_url, concurrency={"Reboot": 1},
                          **fleet.engine_options(TOPIC, engine="worker-based"))
    watcher = coordination.connect(coordination_url)
    pool = cf.ThreadPoolExecutor(max_workers=1)
    try:
        run = pool.submit(engine.run)
        _wait_until(lambda: ledger.exists(), "the task running on the worker")
        held = sorted((e.key, e.info.get("kind"), e.holding)
                      for e in watcher.listing())
        assert held == [("Reboot", "limit", True), ("lb:1", "lock", True)], held
        gate.touch()
        run.result(timeout=60)
        assert watcher.listing() == []
    finally:
        gate.touch()
        pool.shutdown(wait=True)
        watcher.close()
