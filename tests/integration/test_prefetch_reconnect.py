"""After a reconnect a worker's prefetch starts at what it has room for and comes back as the
requests it took before the reconnect settle (Celery's consumer; issue 18, item 4).

A real ``flowengine worker`` of three threads runs two requests that block on their gates; the
private Redis server under it restarts. While both still run, its prefetch is 1 (three slots, two
held by requests of the lost connection); each gate opened gives one back. What the worker
consumes with is read as operators read it: ``flowengine workers --json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, Stage, wait_until
from private_redis import PrivateRedis
from wbe_harness import Broker, ProtocolClient, WorkerFleet, request_body, subprocess_env

# Slowest test here: 21 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "reconnect"
THREADS = 3
GATES = ("held-1", "held-2")


def _prefetch(url: str, exchange: str, pid: int) -> int | None:
    """The prefetch ``flowengine workers --json`` shows for the worker of ``pid``."""
    listed = subprocess.run(
        [sys.executable, "-m", "flowengine.cli.main", "workers", "--url", url,
         "--exchange", exchange, "--wait", "2.5", "--json"],
        capture_output=True, text=True, env=subprocess_env(), timeout=60, check=False)
    rows = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    return next((row["prefetch"] for row in rows if row.get("pid") == pid), None)


def _wait_prefetch(url: str, exchange: str, worker: Any, wanted: int) -> None:
    seen: list[int | None] = []

    def shown() -> bool:
        seen.append(_prefetch(url, exchange, worker.pid))
        return seen[-1] == wanted

    try:
        wait_until(shown, 4 * WAIT, f"prefetch {wanted}")
    except AssertionError as err:
        raise AssertionError(worker.failure(f"{err}; shown: {seen}")) from None


def test_prefetch_after_a_reconnect_follows_the_requests_still_running(
    private_redis: PrivateRedis, exchange: str, fleet_factory: Callable[..., WorkerFleet],
    stage: Stage,
) -> None:  # fmt: skip
    broker = Broker("redis", private_redis.url)
    fleet = fleet_factory(broker, exchange, env=stage.env)
    [worker] = fleet.start(TOPIC, [ft.__name__], threads=THREADS)
    client = ProtocolClient(broker.url, exchange)
    try:
        for gate in GATES:
            client.publish(TOPIC, request_body(f"{ft.__name__}.Gate", gate))
            stage.ledger.wait_for(gate, ft.EXECUTE_START)
    finally:
        client.close()
    _wait_prefetch(broker.url, exchange, worker, THREADS)

    private_redis.stop(keep_data=True)
    private_redis.start()
    # Both requests of the lost connection still hold a thread: room for one more.
    _wait_prefetch(broker.url, exchange, worker, THREADS - len(GATES))
    for settled, gate in enumerate(GATES, start=1):
        stage.gates.open(gate)
        stage.ledger.wait_for(gate, ft.EXECUTE_END)
        _wait_prefetch(broker.url, exchange, worker, THREADS - len(GATES) + settled)
    assert worker.alive, worker.failure("died")
