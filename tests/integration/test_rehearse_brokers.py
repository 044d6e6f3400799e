"""``flowengine rehearse`` with worker processes on real brokers: the booking flow whose refund
is not idempotent is flagged at exactly that task, its fix passes, on Redis and on RabbitMQ."""

from __future__ import annotations

import pytest
from testkit.rehearse_cli import check_booking, rehearse  # tests/ is on sys.path
from wbe_harness import Broker, delete_exchange

# A rehearsal runs the flow a dozen times on real workers: 20-60 s on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.mark.parametrize("fixed", [False, True], ids=["buggy", "fixed"])
@pytest.mark.parametrize("name", ["redis", "rabbitmq"])
def test_rehearse_on_worker_processes_on_a_real_broker(name: str, fixed: bool,
                                                       request: pytest.FixtureRequest,
                                                       exchange: str) -> None:
    broker: Broker = request.getfixturevalue(f"{name}_broker")
    spec = "rehearse_booking:fixed_booking" if fixed else "rehearse_booking:booking"
    try:
        proc = rehearse(spec, "--store", "seat=12A", "--engine", "worker-based",
                        "--workers", "2", "--url", broker.url, "--exchange", exchange)
        check_booking(proc, fixed, stage=["2 worker process(es) on"])
    finally:
        delete_exchange(broker.url, exchange, [f"{exchange}_rehearse"])
