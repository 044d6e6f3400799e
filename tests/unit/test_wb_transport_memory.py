"""Tests for flowengine's thread-safe wrapping of kombu's memory transport."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest

from flowengine.worker_based import client
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker import transport_memory as tm

#: Rounds of the declaration race; kombu's stock transport loses a message in about one round
#: in 500 to 1,000 (three to five of these rounds, in runs without the lock).
ROUNDS = 2000


@pytest.fixture
def eager_thread_switches() -> Iterator[None]:
    # Switching threads every microsecond puts a switch inside kombu's check-then-create steps
    # often enough for the race to show within the rounds.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def memory_connection() -> kombu.Connection:
    return tm.guarded(kombu.Connection("localhost", transport="memory"))


def publish_while_a_consumer_declares(n: int) -> bool:
    """One round on a new exchange: whether the message reached the consumer's queue."""
    name = f"race-{uuid.uuid4().hex}"
    exchange = kombu.Exchange(name, type="direct", durable=True)
    target = kombu.Queue(name, exchange, routing_key=name)
    with memory_connection() as publishing, memory_connection() as consuming:
        consumer_channel = consuming.channel()
        both = threading.Barrier(2)

        def declare() -> None:
            both.wait()
            target(consumer_channel).declare()

        thread = threading.Thread(target=declare)
        thread.start()
        both.wait()
        kombu.Producer(publishing.channel()).publish(
            {"n": n}, exchange=exchange, routing_key=name, declare=[target]
        )
        thread.join()
        return target(consumer_channel).get(no_ack=True) is not None


@pytest.fixture
def no_other_memory_clients() -> None:
    # Broker clients left by earlier tests (they close a few seconds after their last engine)
    # keep polling kombu's memory broker, whose own iteration over its tables is unlocked; with
    # a switch every microsecond that failed this test with "dictionary changed size during
    # iteration". The race measured here is between this test's two connections only.
    client.close_all()


@pytest.mark.usefixtures("no_other_memory_clients", "eager_thread_switches")
def test_a_publish_racing_a_consumers_declaration_is_never_lost() -> None:
    lost = [n for n in range(ROUNDS) if not publish_while_a_consumer_declares(n)]
    assert lost == []


def test_guarded_connections_share_kombus_memory_broker() -> None:
    name = f"shared-{uuid.uuid4().hex}"
    exchange = kombu.Exchange(name, type="direct")
    target = kombu.Queue(name, exchange, routing_key=name)
    with memory_connection() as ours, kombu.Connection(transport="memory") as stock:
        kombu.Producer(ours.channel()).publish(
            "hi", exchange=exchange, routing_key=name, declare=[target]
        )
        message = target(stock.channel()).get(no_ack=True)
        assert message is not None and message.payload == "hi"


@pytest.mark.parametrize("where", [{"url": "memory://"}, {"transport": "memory"}])
def test_proxies_use_the_guarded_transport(where: dict[str, Any]) -> None:
    proxy = px.Proxy("topic", f"ex-{uuid.uuid4().hex[:8]}", **where)
    assert issubclass(proxy.transport_class, tm.Transport)
    assert proxy.connection_details.uri.startswith("memory://")


def test_other_transports_are_left_alone() -> None:
    conn = kombu.Connection("redis://127.0.0.1:1/0")
    assert tm.guarded(conn) is conn


#: Longer than any test may take: a drain that waited its poll out instead of the bell's ring
#: would make the test fail by its timeout rather than pass slowly.
NEVER = 3600.0


def drain_in_thread(conn: kombu.Connection, timeout: float) -> tuple[threading.Thread,
                                                                     list[BaseException]]:
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            conn.drain_events(timeout=timeout)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            errors.append(err)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return thread, errors


def test_a_drain_waiting_for_a_message_is_woken_by_its_put_not_by_its_poll() -> None:
    name = f"bell-{uuid.uuid4().hex}"
    exchange = kombu.Exchange(name, type="direct")
    target = kombu.Queue(name, exchange, routing_key=name)
    options = {"polling_interval": NEVER}
    with tm.guarded(kombu.Connection("localhost", transport="memory",
                                     transport_options=options)) as consuming, \
            memory_connection() as publishing:
        got: list[Any] = []
        delivered = threading.Event()

        def on_message(body: Any, message: Any) -> None:
            got.append(body)
            message.ack()
            delivered.set()

        with kombu.Consumer(consuming.channel(), [target], callbacks=[on_message]):
            waiting = tm.BELL.rings
            thread, errors = drain_in_thread(consuming, NEVER)
            kombu.Producer(publishing.channel()).publish(
                {"n": 1}, exchange=exchange, routing_key=name, declare=[target])
            assert tm.BELL.rings > waiting
            assert delivered.wait(30.0), "the drain slept its poll out: the put rang no bell"
            thread.join(30.0)
        assert (got, errors) == ([{"n": 1}], [])


def test_a_ring_between_a_drains_look_and_its_wait_is_not_lost() -> None:
    bell = tm.Doorbell()
    seen = bell.rings
    bell.ring()  # after the look, before the wait
    woke = threading.Event()
    thread = threading.Thread(target=lambda: (bell.wait(seen, NEVER), woke.set()), daemon=True)
    thread.start()
    assert woke.wait(30.0), "a wait began after a ring it had not seen, and slept through it"
    thread.join(30.0)


def test_a_drain_with_nothing_to_deliver_still_times_out() -> None:
    with memory_connection() as conn:
        queue = kombu.Queue(f"empty-{uuid.uuid4().hex}")
        with kombu.Consumer(conn.channel(), [queue]), pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.05)
