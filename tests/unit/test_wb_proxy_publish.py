"""Publishing through a Proxy's pool of ready producers, over kombu's memory transport.

Faults come from a memory transport whose channel refuses the next N messages with a connection
error, as a broker that went away does: the one edge that is simulated.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
from amqp.exceptions import MessageNacked
from kombu.exceptions import ConnectionError as KombuConnectionError
from kombu.exceptions import OperationalError
from kombu.transport import memory

from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import producers as pd
from flowengine.worker_based.broker import proxy as px

#: Seconds a test waits for something another thread does.
WAIT = 10.0
#: Retry at once: the tests pass no time.
NO_DELAY = {"interval_start": 0.0}


class _Refusals:
    """How many of the next messages the flaky transport refuses, and how."""

    remaining = 0
    error: type[Exception] = KombuConnectionError
    lock = threading.Lock()


class FlakyChannel(memory.Channel):
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        with _Refusals.lock:
            refuse = _Refusals.remaining > 0
            if refuse:
                _Refusals.remaining -= 1
        if refuse:
            raise _Refusals.error("refused by the test")
        super()._put(queue, message, **kwargs)


class FlakyTransport(memory.Transport):
    Channel = FlakyChannel


class _Away:
    """Whether the away transport's broker is down, and how often it was connected to."""

    down = False
    attempts = 0


class AwayTransport(memory.Transport):
    """The memory transport, whose broker refuses connections while :class:`_Away` says so."""

    def establish_connection(self) -> Any:
        _Away.attempts += 1
        if _Away.down:
            raise self.connection_errors[0]("the broker is away (the test)")
        return super().establish_connection()


@pytest.fixture
def exchange() -> str:
    return f"pub-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def proxy(exchange: str) -> Iterator[px.Proxy]:
    _Refusals.remaining = 0
    made = px.Proxy("me", exchange, transport=FlakyTransport, retry_options=NO_DELAY)
    try:
        yield made
    finally:
        made.close()


def notify(n: int = 0) -> pr.Notify:
    return pr.Notify(topic=f"t{n}", tasks=[])


def producer_of(pool: pd.ProducerPool) -> Any:
    """The producer the next acquire gets (given straight back)."""
    with pool.acquire() as producer:
        return producer


def queued(proxy: px.Proxy, key: str) -> list[str]:
    return [message.json()["topic"] for message in proxy.browse(key)]


def test_publishes_reuse_one_producer_and_its_channel(proxy: px.Proxy) -> None:
    proxy.publish(notify(0), "work")
    pool = proxy.producers()
    producer = producer_of(pool)
    channel = producer.channel
    for n in range(1, 20):
        proxy.publish(notify(n), "work")
    assert producer_of(pool) is producer and producer.channel is channel
    assert pool.size == 1 and producer.connection.connected
    assert queued(proxy, "work") == [f"t{n}" for n in range(20)]


def test_concurrent_publishers_never_share_a_producer_nor_pass_the_limit(exchange: str) -> None:
    limit, threads, each = 3, 12, 30
    pool = pd.ProducerPool(kombu.Connection("localhost", transport="memory"), limit)
    target = kombu.Queue(f"{exchange}_work", kombu.Exchange(exchange, type="direct"),
                         routing_key="work")
    in_use: set[int] = set()
    guard = threading.Lock()
    problems: list[str] = []
    start = threading.Barrier(threads)

    def publish_some(worker: int) -> None:
        start.wait(WAIT)
        for n in range(each):
            with pool.acquire() as producer:
                with guard:
                    if id(producer) in in_use:
                        problems.append(f"producer shared by thread {worker}")
                    in_use.add(id(producer))
                    if pool.size > limit:
                        problems.append(f"{pool.size} producers, limit {limit}")
                producer.publish({"n": n}, exchange=target.exchange, routing_key="work",
                                 declare=[target], serializer="json")
                with guard:
                    in_use.discard(id(producer))

    running = [threading.Thread(target=publish_some, args=(i,)) for i in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(WAIT)
    try:
        assert not problems and not any(thread.is_alive() for thread in running)
        with kombu.Connection("localhost", transport="memory") as conn:
            assert target(conn.default_channel).queue_declare().message_count == threads * each
        assert 1 <= pool.size <= limit and pool.idle == pool.size
    finally:
        pool.close()


def test_acquire_waits_while_every_producer_is_in_use() -> None:
    pool = pd.ProducerPool(kombu.Connection("localhost", transport="memory"), 1)
    got = threading.Event()

    def second() -> None:
        with pool.acquire():
            got.set()

    with pool.acquire():
        waiter = threading.Thread(target=second)
        waiter.start()
        # Nothing to await here: this checks that nothing happens while the producer is held.
        assert not got.wait(0.2)
    assert got.wait(WAIT)
    waiter.join(WAIT)
    assert pool.size == 1
    pool.close()


def test_a_producer_whose_publish_failed_is_closed_and_replaced(proxy: px.Proxy) -> None:
    proxy.publish(notify(0), "work")
    pool = proxy.producers()
    failed = producer_of(pool)
    _Refusals.remaining = 1
    with pytest.raises(KombuConnectionError):
        proxy.publish(notify(1), "work", retry=False)
    assert pool.size == 0 and not failed.connection.connected
    proxy.publish(notify(2), "work", retry=False)
    assert producer_of(pool) is not failed
    assert queued(proxy, "work") == ["t0", "t2"]


def test_a_publish_that_recovered_by_retrying_lands_once_on_a_new_producer(
        proxy: px.Proxy) -> None:
    # Each retry goes out on a new connection: the failed one may be dead for good (a broker
    # back from an outage is reached only through a new one).
    proxy.publish(notify(0), "work")
    pool = proxy.producers()
    producer = producer_of(pool)
    _Refusals.remaining = 2
    proxy.publish(notify(1), "work")
    assert producer_of(pool) is not producer and pool.size == 1
    assert queued(proxy, "work") == ["t0", "t1"]


def test_a_reply_declares_its_consumers_queue_only_once_a_connection_was_lost(
        proxy: px.Proxy) -> None:
    """A broker restarted empty forgot the engine's reply queue; a worker's reply that beats the
    engine's own reconnect must still be kept for it. Short of that, replies declare nothing:
    an engine that is gone must not get its queue back."""
    proxy.publish(notify(0), "engine", reply=True)  # no queue: dropped, nothing declared
    _Refusals.remaining = 1  # the connection is lost (publishing anything): it reconnects
    proxy.publish(notify(1), "work")
    proxy.publish(notify(2), "engine", reply=True)
    assert queued(proxy, "engine") == ["t2"]


def test_a_publish_gives_up_at_its_deadline_naming_the_broker_and_the_outage(
        exchange: str) -> None:
    _Refusals.remaining = 1_000_000
    proxy = px.Proxy("me", exchange, transport=FlakyTransport,
                     retry_options={"interval_start": 0.01, "interval_max": 0.02})
    try:
        with pytest.raises(px.BrokerOutage) as caught:
            proxy.publish(notify(0), "work", deadline=0.2)
        text = str(caught.value)
        assert "Publishing NOTIFY to 'work'" in text and "FlakyTransport" in text
        assert "unreachable (outage)" in text and "refused by the test" in text
        assert _Refusals.remaining < 1_000_000 - 2, "it retried before giving up"
    finally:
        _Refusals.remaining = 0
        proxy.close()


def test_a_publish_retries_until_the_broker_is_back(exchange: str) -> None:
    _Refusals.remaining = 20
    proxy = px.Proxy("me", exchange, transport=FlakyTransport,
                     retry_options={"interval_start": 0.001, "interval_max": 0.002})
    try:
        proxy.publish(notify(0), "work", deadline=WAIT)
        assert queued(proxy, "work") == ["t0"] and _Refusals.remaining == 0
    finally:
        proxy.close()


def test_a_nacked_publish_is_sent_again(exchange: str) -> None:
    # RabbitMQ nacks what a quorum queue cannot take (electing a leader after a node died).
    _Refusals.remaining, _Refusals.error = 2, MessageNacked
    proxy = px.Proxy("me", exchange, transport=FlakyTransport, retry_options=NO_DELAY)
    try:
        proxy.publish(notify(0), "work", deadline=WAIT)
        assert queued(proxy, "work") == ["t0"] and _Refusals.remaining == 0
    finally:
        _Refusals.error = KombuConnectionError
        proxy.close()


def test_a_one_attempt_publish_to_a_broker_that_is_away_connects_once(exchange: str) -> None:
    # Kombu would retry connecting a producer's channel on its own beneath the caller: a
    # one-attempt publish (discovery, announcements) would then wait seconds on a broker that
    # is away, and a retried one would not follow its retry_options.
    _Away.down, _Away.attempts = True, 0
    proxy = px.Proxy("me", exchange, transport=AwayTransport, retry_options=NO_DELAY)
    try:
        with pytest.raises(OperationalError, match="away"):
            proxy.publish(notify(0), "work", retry=False)
        assert _Away.attempts == 1, "kombu retried the connection beneath the publish"
        assert proxy.producers().size == 0
        _Away.down = False
        proxy.publish(notify(1), "work", retry=False)
        assert queued(proxy, "work") == ["t1"]
    finally:
        _Away.down = False
        proxy.close()


def test_a_publish_whose_retries_ran_out_drops_its_producer(exchange: str) -> None:
    _Refusals.remaining = 5
    proxy = px.Proxy("me", exchange, transport=FlakyTransport,
                     retry_options=dict(NO_DELAY, max_retries=2))
    try:
        with pytest.raises(OperationalError, match="refused by the test"):
            proxy.publish(notify(0), "work")
        assert proxy.producers().size == 0
        _Refusals.remaining = 0
        proxy.publish(notify(1), "work")
        assert queued(proxy, "work") == ["t1"]
    finally:
        proxy.close()


def test_close_closes_idle_producers_and_a_later_publish_opens_new_ones(proxy: px.Proxy) -> None:
    proxy.publish(notify(0), "work")
    old_pool = proxy.producers()
    old = producer_of(old_pool)
    proxy.close()
    assert not old.connection.connected and old_pool.size == 0
    proxy.publish(notify(1), "work")
    assert proxy.producers() is not old_pool
    assert producer_of(proxy.producers()) is not old
    assert queued(proxy, "work") == ["t0", "t1"]


def test_a_producer_in_use_during_close_is_closed_when_given_back() -> None:
    pool = pd.ProducerPool(kombu.Connection("localhost", transport="memory"), 2)
    with pool.acquire() as held:
        held.publish({}, routing_key="nowhere", serializer="json")
        pool.close()
        assert held.connection.connected  # its publisher is still using it
    assert not held.connection.connected and pool.size == 0
    with pool.acquire() as late:  # a publish racing close() still gets a producer
        assert late is not held
    assert not late.connection.connected


def test_confirmed_and_unconfirmed_publishes_have_separate_pools_only_with_confirms(
        exchange: str) -> None:
    confirming = px.Proxy("me", exchange, transport="memory",
                          transport_options={"confirm_publish": True})
    plain = px.Proxy("me", exchange, transport="memory")
    try:
        assert confirming.producers(True) is not confirming.producers(False)
        unconfirmed = producer_of(confirming.producers(False))
        assert unconfirmed.connection.transport_options["confirm_publish"] is False
        assert plain.producers(True) is plain.producers(False)
    finally:
        confirming.close()
        plain.close()


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1, not 0"):
        pd.ProducerPool(kombu.Connection("localhost", transport="memory"), 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_empty_pools(proxy: px.Proxy) -> None:
    proxy.publish(notify(0), "work")
    pool = proxy.producers()
    assert pool.size == 1
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        os._exit(0 if (pool.size, pool.idle) == (0, 0) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pool.size == 1  # the parent's pool is untouched
