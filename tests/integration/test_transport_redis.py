"""flowengine's Redis transport on a real Redis server: routing, its binding cache, one client.

Publishers use :func:`transport_redis.lean` connections; the queues are read and changed through
kombu's stock Redis transport, as another process would. The binding cache's clock is replaced
on the publishing channel, so its time-to-live passes without sleeping.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis
from kombu.transport import redis as kombu_redis
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from wbe_harness import Broker, delete_exchange

from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker import publisher as pb
from flowengine.worker_based.broker import transport_redis as tr

pytestmark = pytest.mark.integration

#: Seconds a test waits for a delivery.
WAIT = 10.0


@pytest.fixture
def url(redis_broker: Broker, exchange: str) -> Iterator[str]:
    """The Redis URL; everything named after this test's exchange is removed afterwards."""
    try:
        yield redis_broker.url
    finally:
        delete_exchange(redis_broker.url, exchange)


@pytest.fixture
def other(url: str) -> Iterator[kombu.Channel]:
    """A channel of kombu's stock Redis transport: another process's view of the broker."""
    with kombu.Connection(url) as conn:
        yield conn.default_channel


class Publisher:
    """A producer on a lean connection, with the binding cache's clock in the test's hands."""

    def __init__(self, url: str, exchange: str, **options: Any) -> None:
        self.conn = tr.lean(kombu.Connection(url, transport_options=options))
        self.channel = self.conn.default_channel
        self.clock = self.channel.clock = ManualClock()
        self.exchange = kombu.Exchange(exchange, type="direct")
        self.producer = kombu.Producer(self.channel, exchange=self.exchange, serializer="json")

    def send(self, n: int, key: str) -> None:
        self.producer.publish({"n": n}, routing_key=key)

    def expire_cache(self) -> None:
        self.clock.now += tr.BINDING_CACHE_TTL


@pytest.fixture
def publisher(url: str, exchange: str) -> Iterator[Publisher]:
    made = Publisher(url, exchange)
    try:
        yield made
    finally:
        made.conn.release()


def bound(channel: kombu.Channel, exchange: str, name: str, key: str) -> kombu.Queue:
    """Queue ``<exchange>_<name>`` declared and bound with ``key`` through ``channel``."""
    declared = kombu.Queue(f"{exchange}_{name}", kombu.Exchange(exchange, type="direct"),
                           routing_key=key)(channel)
    declared.declare()
    return declared


def drained(declared: kombu.Queue) -> list[int]:
    """The ``n`` of every message waiting in ``declared`` (taken off it)."""
    got = []
    while (message := declared.get(no_ack=True, accept=["application/json"])) is not None:
        got.append(message.decode()["n"])
    return got


# ---- which connections get the transport ------------------------------------------------------


def test_redis_urls_and_the_redis_name_get_flowengines_transport() -> None:
    lean = tr.lean(kombu.Connection("redis://:secret@127.0.0.1:6390/3"))
    assert lean.get_transport_cls() is tr.Transport
    assert (lean.hostname, lean.port, lean.virtual_host, lean.password) == (
        "127.0.0.1", 6390, "3", "secret")
    assert tr.lean(kombu.Connection("localhost", transport="redis")).get_transport_cls() \
        is tr.Transport
    # rediss:// keeps the TLS settings kombu derives from the scheme.
    stock_tls = kombu.Connection("rediss://127.0.0.1:6390/0")
    lean_tls = tr.lean(stock_tls)
    assert lean_tls.get_transport_cls() is tr.Transport and lean_tls.ssl == stock_tls.ssl
    assert lean_tls.ssl  # kombu's default for rediss:// without options
    # Sentinel URLs: the same channel over kombu's Sentinel one, every Sentinel kept.
    sentinels = tr.lean(kombu.Connection("sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380",
                                         transport_options={"master_name": "mymaster"}))
    assert sentinels.get_transport_cls() is tr.SentinelTransport
    assert sentinels.alt == ["sentinel://127.0.0.1:26379", "sentinel://127.0.0.1:26380"]
    assert issubclass(tr.SentinelTransport.Channel, kombu_redis.SentinelChannel)


@pytest.mark.parametrize("url, transport", [
    ("redis+socket:///tmp/redis.sock", None),
    ("amqp://guest:guest@127.0.0.1:5672//", None),
    ("localhost", "memory"),
    ("redis://127.0.0.1:6379/0", kombu_redis.Transport),  # a class the caller chose
])
def test_other_transports_are_left_alone(url: str, transport: Any) -> None:
    conn = kombu.Connection(url, transport=transport)
    assert tr.lean(conn) is conn


def test_kombu_itself_keeps_its_stock_redis_transport(url: str, exchange: str) -> None:
    proxy = px.Proxy("me", exchange, url=url)
    try:
        assert proxy.transport_class is tr.Transport
        assert kombu.Connection(url).get_transport_cls() is kombu_redis.Transport
    finally:
        proxy.close()


def test_a_proxy_reports_the_uri_kombu_would(redis_broker: Broker, exchange: str) -> None:
    with_password = redis_broker.url.replace("redis://", "redis://:s3cret@", 1)
    proxy = px.Proxy("me", exchange, url=with_password)
    details = proxy.connection_details
    assert details.uri == px.mask_url(kombu.Connection(with_password).as_uri(
        include_password=True))
    assert "s3cret" not in details.uri and details.uri.startswith("redis://")
    assert details.transport == "redis"
    assert details.options["visibility_timeout"] == px.REDIS_VISIBILITY_TIMEOUT


# ---- routing and the binding cache ------------------------------------------------------------


def test_messages_go_to_the_queue_their_key_names(publisher: Publisher, other: kombu.Channel,
                                                  exchange: str) -> None:
    first = bound(other, exchange, "a", "a")
    second = bound(other, exchange, "b", "b")
    for n in range(6):
        publisher.send(n, "a" if n % 2 else "b")
    assert (drained(first), drained(second)) == ([1, 3, 5], [0, 2, 4])


def test_a_key_missing_from_the_cache_is_looked_up_at_once(
        publisher: Publisher, other: kombu.Channel, exchange: str) -> None:
    first = bound(other, exchange, "a", "a")
    publisher.send(1, "a")  # fills the cache
    later = bound(other, exchange, "b", "b")
    publisher.send(2, "b")
    assert (drained(first), drained(later)) == ([1], [2])


def test_a_second_queue_on_a_cached_key_is_seen_once_the_cache_expires(
        publisher: Publisher, other: kombu.Channel, exchange: str) -> None:
    first = bound(other, exchange, "a", "a")
    publisher.send(1, "a")
    joined = bound(other, exchange, "a2", "a")
    publisher.send(2, "a")  # the documented window: the cache knows one queue for "a"
    publisher.expire_cache()
    publisher.send(3, "a")
    assert (drained(first), drained(joined)) == ([1, 2, 3], [3])


def test_keys_shared_by_several_queues_are_always_looked_up(
        publisher: Publisher, other: kombu.Channel, exchange: str) -> None:
    one, two = bound(other, exchange, "one", "all"), bound(other, exchange, "two", "all")
    publisher.send(1, "all")
    three = bound(other, exchange, "three", "all")
    publisher.send(2, "all")
    assert (drained(one), drained(two), drained(three)) == ([1, 2], [1, 2], [2])


def test_the_publishing_channels_own_bindings_refresh_its_cache(
        publisher: Publisher, other: kombu.Channel, exchange: str) -> None:
    first = bound(other, exchange, "a", "a")
    publisher.send(1, "a")
    bound(publisher.channel, exchange, "a2", "a")
    publisher.send(2, "a")
    joined = kombu.Queue(f"{exchange}_a2")(other)
    assert (drained(first), drained(joined)) == ([1, 2], [2])


def test_a_zero_time_to_live_looks_every_key_up(url: str, other: kombu.Channel,
                                                exchange: str) -> None:
    publisher = Publisher(url, exchange, binding_cache_ttl=0)
    try:
        first = bound(other, exchange, "a", "a")
        publisher.send(1, "a")
        joined = bound(other, exchange, "a2", "a")
        publisher.send(2, "a")
        assert (drained(first), drained(joined)) == ([1, 2], [2])
    finally:
        publisher.conn.release()


def test_a_queue_deleted_then_bound_again_gets_the_next_messages(
        publisher: Publisher, other: kombu.Channel, exchange: str) -> None:
    first = bound(other, exchange, "a", "a")
    publisher.send(1, "a")
    first.delete()
    again = bound(other, exchange, "a", "a")
    publisher.send(2, "a")
    publisher.expire_cache()
    publisher.send(3, "a")
    assert drained(again) == [2, 3]


def test_a_deleted_queue_receives_only_until_the_cache_expires(
        publisher: Publisher, other: kombu.Channel, exchange: str) -> None:
    client = other.client

    def listed() -> int:  # a queue is a list per priority step
        return sum(client.llen(other._q_for_pri(first.name, step))
                   for step in other.priority_steps)

    first = bound(other, exchange, "a", "a")
    publisher.send(1, "a")
    first.delete()
    publisher.send(2, "a")  # the documented window: pushed onto the deleted queue's list
    assert listed() == 1
    publisher.expire_cache()
    publisher.send(3, "a")  # dropped, as kombu drops a message no queue is bound for
    assert listed() == 1


# ---- declarations a server forgot -------------------------------------------------------------
# A Redis server restarted without its data forgets every binding, and the redis client
# reconnects on the next command without an error anyone sees. Deleting the exchange's keys does
# the same to one exchange, without restarting the server other tests share.


def forget(url: str, exchange: str) -> None:
    """Delete every Redis key of ``exchange`` (its bindings and queues), as an empty restart
    does; ``delete_exchange`` is best effort, so that it did is checked."""
    delete_exchange(url, exchange)
    client = redis.Redis.from_url(url)
    try:
        assert not list(client.scan_iter(match=f"*{exchange}*")), "the exchange's keys remain"
    finally:
        client.close()


def test_a_binding_declared_again_is_written_again_after_redis_forgot_it(
        url: str, other: kombu.Channel, exchange: str) -> None:
    conn = tr.lean(kombu.Connection(url))
    try:
        declared = bound(conn.default_channel, exchange, "a", "a")
        forget(url, exchange)
        # What a consumer does every few seconds (proxy.DECLARATION_TTL): kombu's channel
        # remembers the binding and used to skip it.
        declared.declare()
        kombu.Producer(other, exchange=kombu.Exchange(exchange, type="direct"),
                       serializer="json").publish({"n": 1}, routing_key="a")
        assert drained(declared) == [1]
    finally:
        conn.release()


def test_a_publisher_declares_its_target_again_after_redis_forgot_it(
        url: str, other: kombu.Channel, exchange: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every publish declares (the declarations' time to live is over at once).
    monkeypatch.setattr(pb, "DECLARATION_TTL", -1.0)
    # Routing reads the bindings from Redis on every publish (no copy to route by).
    publisher = pb.Publisher(exchange, url=url, transport_options={"binding_cache_ttl": 0})
    try:
        publisher.publish(pr.Notify(), "topic")
        forget(url, exchange)
        # kombu's connection remembers declaring the queue and used to skip it: the message
        # was then dropped unrouted until the queue's consumer declared it again.
        publisher.publish(pr.Notify(), "topic")
        waiting = kombu.Queue(f"{exchange}_topic")(other)
        assert waiting.get(no_ack=True) is not None
        assert waiting.get(no_ack=True) is None
    finally:
        publisher.close()


# ---- one command client -----------------------------------------------------------------------


@pytest.fixture
def client_constructions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per ``redis.Redis`` built while the test runs."""
    built: list[int] = []
    original = redis.Redis.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return built


def publish_and_ack(conn: kombu.Connection, exchange: str, count: int) -> None:
    channel = conn.default_channel
    target = bound(channel, exchange, "work", "work")
    producer = kombu.Producer(channel, exchange=target.exchange, serializer="json")
    for n in range(count):
        producer.publish({"n": n}, routing_key="work")
    for _ in range(count):
        message = target.get(no_ack=False, accept=["application/json"])
        assert message is not None
        message.ack()


def test_one_client_serves_every_publish_and_ack(url: str, exchange: str,
                                                 client_constructions: list[int]) -> None:
    with kombu.Connection(url) as stock:  # the counter works: kombu's own builds one per call
        publish_and_ack(stock, exchange, 20)
    assert len(client_constructions) > 40
    client_constructions.clear()
    with tr.lean(kombu.Connection(url)) as lean:
        publish_and_ack(lean, exchange, 100)
    # The channel's consume-loop client and its command client.
    assert len(client_constructions) <= 2


def test_a_new_client_serves_the_pool_built_after_a_reconnect(publisher: Publisher,
                                                              other: kombu.Channel,
                                                              exchange: str) -> None:
    first = bound(other, exchange, "a", "a")
    publisher.send(1, "a")
    before = publisher.channel._command_client
    publisher.channel._disconnect_pools()
    publisher.send(2, "a")
    after = publisher.channel._command_client
    assert after is not before and after.connection_pool is publisher.channel.pool
    assert drained(first) == [1, 2]


def test_threads_settling_on_one_channel_share_its_client(url: str, exchange: str) -> None:
    count, threads = 200, 8
    with tr.lean(kombu.Connection(url)) as conn:
        channel = conn.default_channel
        target = bound(channel, exchange, "work", "work")
        producer = kombu.Producer(channel, exchange=target.exchange, serializer="json")
        for n in range(count):
            producer.publish({"n": n}, routing_key="work")
        taken = [target.get(no_ack=False, accept=["application/json"]) for _ in range(count)]
        tags = [message.delivery_tag for message in taken]
        errors: list[BaseException] = []

        def settle(share: list[Any]) -> None:
            try:
                for message in share:
                    if message.decode()["n"] % 2:
                        message.ack()
                    else:
                        message.requeue()
            except BaseException as err:
                errors.append(err)

        running = [threading.Thread(target=settle, args=(taken[i::threads],))
                   for i in range(threads)]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(WAIT)
        assert not errors
        assert not any(channel.client.hexists(channel.unacked_key, tag) for tag in tags)
        assert sorted(drained(target)) == list(range(0, count, 2))


# ---- a Proxy on the transport -----------------------------------------------------------------


def test_a_proxy_acks_requeues_and_rejects_from_other_threads(url: str, exchange: str) -> None:
    delivered: queue.Queue[tuple[Any, Any]] = queue.Queue()
    consumer = px.Proxy("work", exchange, {pr.NOTIFY: dp.Handler(
        lambda data, message: delivered.put((data, message)), manual_ack=True)}, url=url)
    sender = px.Proxy("sender", exchange, url=url)
    thread = threading.Thread(target=consumer.start, daemon=True)
    thread.start()
    try:
        assert consumer.wait(WAIT)
        for name in ("acked", "requeued", "rejected"):
            sender.publish(pr.Notify(topic=name, tasks=[]), "work")
        settle = {"acked": consumer.ack, "requeued": consumer.requeue,
                  "rejected": consumer.reject}
        for _ in range(3):
            data, message = delivered.get(timeout=WAIT)
            settle[data["topic"]](message)
        data, message = delivered.get(timeout=WAIT)
        assert data["topic"] == "requeued" and message.redelivered
        consumer.ack(message)
        assert consumer.unsettled == 0
        with kombu.Connection(url) as conn:
            channel = conn.default_channel
            assert channel.client.llen(f"{exchange}_work") == 0
            assert not channel.client.hexists(channel.unacked_key, message.tag)
    finally:
        consumer.stop()
        assert consumer.wait_stopped(WAIT)
        consumer.close()
        sender.close()


@contextlib.contextmanager
def replies_consumer(url: str, exchange: str, handler: dp.Handler,
                     auto_ack: bool) -> Iterator[px.Proxy]:
    """A consuming proxy on queue ``<exchange>_replies``, which three NOTIFY messages reach."""
    consumer = px.Proxy("replies", exchange, {pr.NOTIFY: handler}, url=url, auto_ack=auto_ack)
    sender = px.Proxy("sender", exchange, url=url)
    thread = threading.Thread(target=consumer.start, daemon=True)
    thread.start()
    try:
        assert consumer.wait(WAIT)
        for n in range(3):
            sender.publish(pr.Notify(topic=f"t{n}", tasks=[]), "replies")
        yield consumer
    finally:
        consumer.stop()
        assert consumer.wait_stopped(WAIT)
        consumer.close()
        sender.close()


@pytest.mark.parametrize("auto_ack", [True, False])
def test_an_auto_ack_consumer_keeps_no_copy_of_its_deliveries(
        url: str, exchange: str, auto_ack: bool) -> None:
    # An engine's replies: acknowledged on receipt, useless once the engine is gone. Kombu's
    # copy of each unacknowledged delivery (two Redis round trips a message) buys them nothing.
    delivered: queue.Queue[Any] = queue.Queue()
    handler = dp.Handler(lambda _data, message: delivered.put(message), manual_ack=True)
    with replies_consumer(url, exchange, handler, auto_ack) as consumer:
        messages = [delivered.get(timeout=WAIT) for _ in range(3)]
        with kombu.Connection(url) as conn:
            channel = conn.default_channel
            copies = [channel.client.hexists(channel.unacked_key, m.tag)
                      for m in messages]
        # Not yet acknowledged (manual_ack): kombu keeps a copy unless the consumer auto-acks.
        assert copies == [not auto_ack] * 3
        assert consumer.unsettled == (0 if auto_ack else 3)
        for message in messages:
            consumer.ack(message)  # a no-op when auto-acked, and no error; Redis settles at once
        assert consumer.unsettled == 0


@pytest.mark.parametrize("auto_ack", [True, False])
def test_an_auto_ack_consumer_sends_redis_no_acknowledgements(
        url: str, exchange: str, auto_ack: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    acks: list[Any] = []
    real_ack = kombu_redis.QoS.ack

    def counted(self: Any, delivery_tag: Any) -> None:
        acks.append(delivery_tag)
        real_ack(self, delivery_tag)

    monkeypatch.setattr(kombu_redis.QoS, "ack", counted)
    delivered: queue.Queue[Any] = queue.Queue()
    handler = dp.Handler(lambda data, _message: delivered.put(data))
    with replies_consumer(url, exchange, handler, auto_ack):
        assert [delivered.get(timeout=WAIT)["topic"] for _ in range(3)] == ["t0", "t1", "t2"]
        # Each delivery is acknowledged on receipt, before its handler runs: one Redis round
        # trip a message, unless the broker settled it on delivery.
        assert len(acks) == (0 if auto_ack else 3)


# ---- reading queues without acknowledgements in batches ---------------------------------------


class Reader:
    """A consumer on a lean connection: what one poll of the consume loop delivers."""

    def __init__(self, url: str, exchange: str, no_ack: bool, **options: Any) -> None:
        self.conn = tr.lean(kombu.Connection(url, transport_options=options))
        self.channel = self.conn.default_channel
        self.queue = bound(self.channel, exchange, "batched", "batched")
        self.got: list[int] = []
        self.fail_at: int | None = None
        self.consumer = kombu.Consumer(self.channel, queues=[self.queue], no_ack=no_ack,
                                       callbacks=[self._on_message], accept=["json"])
        self.consumer.consume()

    def _on_message(self, body: Any, _message: Any) -> None:
        self.got.append(body["n"])
        if body["n"] == self.fail_at:
            raise RuntimeError(f"consumer failed on message {body['n']}")

    def poll(self) -> list[int]:
        """What one poll delivers (the ``n`` of each message, in order)."""
        before = len(self.got)
        self.conn.drain_events(timeout=WAIT)
        return self.got[before:]

    def close(self) -> None:
        self.consumer.cancel()
        self.conn.release()


@pytest.fixture
def reader_for(url: str, exchange: str) -> Iterator[Any]:
    made: list[Reader] = []

    def make(no_ack: bool, **options: Any) -> Reader:
        made.append(Reader(url, exchange, no_ack, **options))
        return made[-1]

    try:
        yield make
    finally:
        for reader in made:
            reader.close()


@pytest.mark.parametrize(("no_ack", "options", "first_poll"), [
    (True, {}, list(range(10))),                # an engine's replies: what waits, in order
    (True, {"batch_read": 3}, [0, 1, 2, 3]),   # the one BRPOP returned, and three more
    (True, {"batch_read": 0}, [0]),            # as kombu reads
    (False, {}, [0]),                          # a worker's topic: never beyond its prefetch
])
def test_a_queue_consumed_without_acknowledgements_is_read_in_batches(
        reader_for: Any, publisher: Publisher, no_ack: bool, options: dict[str, Any],
        first_poll: list[int]) -> None:
    reader = reader_for(no_ack, **options)
    for n in range(10):
        publisher.send(n, "batched")
    assert reader.poll() == first_poll
    while len(reader.got) < 10:
        reader.poll()
    assert reader.got == list(range(10))  # nothing lost, nothing out of order


def test_a_batch_leaves_a_more_urgent_list_first(reader_for: Any, publisher: Publisher) -> None:
    reader = reader_for(True)
    for n in range(5):
        publisher.send(n, "batched")
    publisher.producer.publish({"n": 99}, routing_key="batched", priority=9)
    # The urgent list is popped first, and alone: a batch takes only from the list it began.
    assert reader.poll() == [99]
    assert reader.poll() == [0, 1, 2, 3, 4]


def test_what_a_failed_consumer_did_not_take_goes_back_in_order(
        reader_for: Any, publisher: Publisher, other: kombu.Channel, exchange: str) -> None:
    reader = reader_for(True)
    reader.fail_at = 2
    for n in range(8):
        publisher.send(n, "batched")
    with pytest.raises(RuntimeError, match="consumer failed on message 2"):
        reader.poll()
    assert reader.got == [0, 1, 2]
    reader.consumer.cancel()
    waiting = kombu.Queue(f"{exchange}_batched", kombu.Exchange(exchange, type="direct"),
                          routing_key="batched")(other)
    assert drained(waiting) == [3, 4, 5, 6, 7]


def test_a_server_without_counted_rpop_is_read_one_message_at_a_time(
        reader_for: Any, publisher: Publisher, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=tr.__name__)
    reader = reader_for(True)
    real = redis.connection.AbstractConnection.send_command

    def before_6_2(self: Any, *args: Any, **options: Any) -> Any:
        # Redis before 6.2 refuses RPOP's count as a wrong number of arguments; one argument
        # too many makes this server refuse the same way, taking nothing off the list.
        if args[0] == "RPOP":
            args = (*args, "refused")
        return real(self, *args, **options)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_command", before_6_2)
    for n in range(4):
        publisher.send(n, "batched")
    assert reader.poll() == [0]
    assert "read one message at a time" in caplog.text
    assert reader.channel.batch_read == 0
    assert [reader.poll() for _ in range(3)] == [[1], [2], [3]]  # every message, in order
