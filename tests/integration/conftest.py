"""Fixtures of the integration tests: real brokers and worker processes.

Brokers: Redis and RabbitMQ as ``.ci/services.sh start`` runs them on 127.0.0.1 (see
``wbe_harness.BROKERS`` for the URLs and the variables that override them). A broker that does
not answer is started with that script (once a session, when the servers are installed) and
checked again; still missing, it fails the test when ``CI=true`` and skips it otherwise.

Worker processes: ``fleet_factory`` gives :class:`~wbe_harness.WorkerFleet` s whose processes are
all stopped by pid (SIGTERM, then SIGKILL) when the test ends, whatever the test did to them, and
whose queues and exchange are then removed. Module-scoped pools build a ``WorkerFleet`` directly
and call ``stop_all()`` themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_support import EngineRuns, Stage
from private_redis import PrivateRedis
from wbe_harness import (
    BROKERS,
    Broker,
    WorkerFleet,
    require_broker,
    unique_exchange,
)


@pytest.fixture(scope="session", params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> Broker:
    """Each real broker in turn."""
    return require_broker(request.param)


@pytest.fixture(scope="session")
def redis_broker() -> Broker:
    """The Redis server."""
    return require_broker("redis")


@pytest.fixture(scope="session")
def rabbitmq_broker() -> Broker:
    """The RabbitMQ server."""
    return require_broker("rabbitmq")


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A Redis server of this test's own (on a free port), killed when the test ends."""
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def exchange(request: pytest.FixtureRequest) -> str:
    """A fresh exchange name for this test (named after it)."""
    return unique_exchange(request.node.originalname[:40].replace("_", "-"))


@pytest.fixture
def fleet_factory(tmp_path: Path) -> Iterator[Callable[..., WorkerFleet]]:
    """Makes ``WorkerFleet(broker, exchange, env=..., taskflow_compat=...)`` s for this test."""
    fleets: list[WorkerFleet] = []

    def make(broker: Broker, exchange: str, **options: Any) -> WorkerFleet:
        fleet = WorkerFleet(broker, exchange, tmp_path, **options)
        fleets.append(fleet)
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            fleet.stop_all()


@pytest.fixture
def stage(tmp_path: Path) -> Stage:
    """A fault test's files: the task ledger, gates and canaries."""
    return Stage.make(tmp_path / "stage")


@pytest.fixture
def runs() -> Iterator[EngineRuns]:
    """Engines run on threads; any still running when the test ends is stopped."""
    started = EngineRuns()
    try:
        yield started
    finally:
        started.close()
