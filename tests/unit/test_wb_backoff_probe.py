"""A retry's long sleep ends once the broker that was away accepts connections again.

The backoff spares a broker that is away; these tests pin that it does not also make a
returning broker wait out the rest of a sleep that grew to many seconds, and that a broker
which accepts connections but fails the attempts is not retried sooner than the backoff says.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest

from flowengine.worker_based import backoff as bo
from flowengine.worker_based.broker.connection import connect, reachability

#: A backoff whose first sleep is long (no jitter): a test that waited it out would time out.
LONG = bo.RetryOptions(interval_start=60.0, jitter=0.0)


class Looks:
    """A probe answering from a script (then True), counting its calls."""

    def __init__(self, *answers: bool) -> None:
        self._answers = list(answers)
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self._answers.pop(0) if self._answers else True


@pytest.fixture(autouse=True)
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bo, "PROBE_EVERY", 0.01)


def test_a_sleep_ends_when_the_broker_seen_away_is_back() -> None:
    looks = Looks(False, False, True)
    backoff = bo.Backoff(LONG, "Publishing", "redis://h", threading.Event(), probe=looks)
    backoff(ConnectionError("refused"))  # would sleep 60 s without the probe
    assert looks.calls == 3
    assert backoff.attempt == 1


def test_a_broker_never_seen_away_does_not_shorten_the_sleep() -> None:
    # It accepts connections, yet the attempt failed: retrying at every look would hammer it,
    # and looking again would only fill its log with closed connections.
    looks = Looks()
    options = bo.RetryOptions(interval_start=0.2, jitter=0.0)
    backoff = bo.Backoff(options, "Publishing", "redis://h", threading.Event(), probe=looks)
    backoff(ConnectionError("refused"))
    assert backoff.elapsed >= 0.2
    assert looks.calls == 1


def test_being_back_ends_one_sleep_only_until_the_broker_is_seen_away_again() -> None:
    looks = Looks(False, True)
    options = bo.RetryOptions(interval_start=0.1, multiplier=1.0, jitter=0.0)
    backoff = bo.Backoff(options, "Publishing", "redis://h", threading.Event(), probe=looks)
    backoff(ConnectionError("refused"))
    assert looks.calls == 2
    started = backoff.elapsed
    backoff(ConnectionError("refused again"))  # back, yet failing: the whole sleep now
    assert looks.calls == 3
    assert backoff.elapsed - started >= 0.1


def test_stopping_ends_a_probing_sleep() -> None:
    stop = threading.Event()

    def away() -> bool:
        stop.set()
        return False

    backoff = bo.Backoff(LONG, "Publishing", "redis://h", stop, probe=away)
    with pytest.raises(bo.RetryAbandoned):
        backoff(ConnectionError("refused"))


def test_a_short_sleep_does_not_look() -> None:
    looks = Looks(False)
    options = bo.RetryOptions(interval_start=0.005, jitter=0.0)
    bo.Backoff(options, "Publishing", "redis://h", threading.Event(), probe=looks)(
        ConnectionError("refused"))
    assert looks.calls == 0


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield server
    finally:
        server.close()


def test_reachability_connects_to_a_node_and_finds_a_closed_port_away(
        listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    probe = reachability(kombu.Connection(f"redis://127.0.0.1:{port}/0"))
    assert probe is not None and probe()
    listening.close()
    assert not probe()


def test_reachability_tries_every_node_of_a_failover_list(listening: socket.socket) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    away = closed.getsockname()[1]
    closed.close()
    port = listening.getsockname()[1]
    probe = reachability(kombu.Connection(
        f"amqp://guest:guest@127.0.0.1:{away}//;amqp://guest:guest@127.0.0.1:{port}//"))
    assert probe is not None and probe()


def test_a_transport_without_a_network_address_is_not_probed(tmp_path: Path) -> None:
    assert reachability(kombu.Connection("memory://")) is None
    embedded, _uri = connect(None, None, {"data_folder": str(tmp_path / "fs")})
    assert reachability(embedded) is None
