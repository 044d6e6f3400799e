"""flowengine's beanstalkd transport on the real test beanstalkd: what a tube does for kombu.

Publishers and consumers are separate kombu connections, as separate processes would be; the
server's own view (``stats-tube``, ``stats-job``) is read with a bare greenstalk client. Times
that beanstalkd counts in whole seconds (delays, time-to-run) are kept at one or two seconds
and waited for with :func:`fault_support.wait_until`, never slept through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import greenstalk
import kombu
import pytest
from fault_support import wait_until

from flowengine import engines, task
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.broker import transport_beanstalk as tb
from flowengine.worker_based.worker import Worker

pytestmark = pytest.mark.integration

#: Seconds a test waits for something the server does by itself (a delay or a TTR running out).
WAIT = 10.0


class Bench:
    """An exchange of this test's own, connections to the server, and cleanup."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.exchange = kombu.Exchange(f"bt-{uuid.uuid4().hex[:10]}", type="direct")
        self.connections: list[kombu.Connection] = []
        self.queues: list[str] = []
        host, port = url.split("//", 1)[1].split(":")
        self.server = greenstalk.Client((host, int(port)), encoding=None)

    def connect(self) -> kombu.Connection:
        conn = kombu.Connection(self.url)
        self.connections.append(conn)
        return conn

    def queue(self, key: str, conn: kombu.Connection | None = None) -> kombu.Queue:
        name = f"{self.exchange.name}_{key}"
        self.queues.append(name)
        channel = (conn or self.connect()).channel()
        bound = kombu.Queue(name, self.exchange, routing_key=key)(channel)
        bound.declare()
        return bound

    def publish(self, body: Any, key: str, conn: kombu.Connection | None = None,
                **options: Any) -> None:
        producer = kombu.Producer((conn or self.connect()).channel(), self.exchange)
        producer.publish(body, routing_key=key, serializer="json", **options)

    def tube(self, key: str) -> dict[str, Any]:
        try:
            return dict(self.server.stats_tube(tb.tube_name(f"{self.exchange.name}_{key}")))
        except greenstalk.NotFoundError:
            return {"current-jobs-ready": 0, "current-jobs-delayed": 0,
                    "current-jobs-buried": 0, "current-jobs-reserved": 0}

    def close(self) -> None:
        with kombu.Connection(self.url) as conn, conn.channel() as channel:
            for name in self.queues:
                channel.queue_delete(name)
            self.exchange(channel).delete()
        for conn in self.connections:
            conn.release()
        self.server.close()


@pytest.fixture
def bench(beanstalk_url: str) -> Iterator[Bench]:
    made = Bench(beanstalk_url)
    try:
        yield made
    finally:
        made.close()


def _get(queue: kombu.Queue) -> Any:
    return wait_until(lambda: queue.get(no_ack=False), WAIT, f"a message on {queue.name}")


# ---- names and numbers ------------------------------------------------------------------------


def test_tube_names_are_valid_distinct_and_bounded() -> None:
    names = ["ex_flowengine.worker.host:1234:abcd", "-lead", "a$b", "é", "x" * 300, "x" * 301]
    tubes = [tb.tube_name(n) for n in names]
    assert tubes[0] == "ex_flowengine.worker.host$3a1234$3aabcd"
    assert tubes[1].startswith("$2d") and tubes[2] == "a$24b" and tubes[3] == "$c3$a9"
    assert all(len(t) <= tb.bindings.MAX_TUBE_NAME for t in tubes) and len(set(tubes)) == len(tubes)


def test_amqp_priority_maps_to_beanstalkd_priority_lower_first() -> None:
    assert tb.beanstalk_priority(None) == tb.DEFAULT_PRIORITY
    assert tb.beanstalk_priority(9) == tb.DEFAULT_PRIORITY - 9 < tb.beanstalk_priority(1)
    assert tb.beanstalk_priority(10_000) == tb.DEFAULT_PRIORITY - tb.MAX_PRIORITY
    assert tb.beanstalk_priority(-5) == tb.beanstalk_priority("junk") == tb.DEFAULT_PRIORITY


# ---- routing ----------------------------------------------------------------------------------


def test_a_binding_made_on_one_connection_routes_another_connections_messages(
        bench: Bench) -> None:
    queue = bench.queue("k")  # declared and bound on its own connection
    bench.publish({"n": 1}, "k")  # a connection that never declared it
    bench.publish({"n": 2}, "nobody-bound-this")
    assert _get(queue).payload == {"n": 1}
    assert bench.tube("k")["current-jobs-ready"] == 0


def test_a_key_bound_to_two_queues_reaches_both_and_unbinding_stops_it(bench: Bench) -> None:
    first, second = bench.queue("a"), bench.queue("b")
    second.bind_to(bench.exchange, routing_key="a")
    bench.publish("both", "a")
    assert _get(first).payload == _get(second).payload == "both"
    second.unbind_from(bench.exchange, routing_key="a")
    bench.publish("one", "a")
    assert _get(first).payload == "one"
    assert second.get() is None


def test_fanout_reaches_every_bound_queue(bench: Bench) -> None:
    bench.exchange = kombu.Exchange(bench.exchange.name, type="fanout")
    queues = [bench.queue(key) for key in ("x", "y")]
    publisher = bench.connect()
    bench.exchange(publisher.channel()).declare()
    bench.publish({"all": True}, "", conn=publisher)
    assert [_get(q).payload for q in queues] == [{"all": True}] * 2


def test_deleting_the_exchange_removes_its_bindings_from_the_server(bench: Bench) -> None:
    bench.queue("gone")
    prefix = tb.bindings.exchange_prefix(bench.exchange.name)
    assert [t for t in bench.server.tubes() if t.startswith(prefix)]
    with kombu.Connection(bench.url) as conn, conn.channel() as channel:
        bench.exchange(channel).declare()
        bench.exchange(channel).delete()
    assert not [t for t in bench.server.tubes() if t.startswith(prefix)]


# ---- priorities and delays --------------------------------------------------------------------


def test_waiting_messages_are_delivered_most_urgent_first(bench: Bench) -> None:
    queue = bench.queue("p")
    publisher = bench.connect()
    for priority in (0, 9, 4, None, 7):
        bench.publish({"p": priority}, "p", conn=publisher, priority=priority)
    order = [_get(queue) for _ in range(5)]
    for message in order:
        message.ack()
    assert [m.payload["p"] for m in order] == [9, 7, 4, 0, None]


def test_a_delay_header_holds_the_message_back_for_that_long(bench: Bench) -> None:
    queue = bench.queue("d")
    sent = time.monotonic()
    bench.publish("later", "d", headers={tb.HEADER_DELAY: 1.5})
    assert bench.tube("d")["current-jobs-delayed"] == 1
    assert queue.get() is None
    assert _get(queue).payload == "later"
    assert time.monotonic() - sent >= 1.0  # beanstalkd rounds up to whole seconds (2 s)


# ---- time to run, touch, redelivery -----------------------------------------------------------


def test_a_held_job_whose_ttr_runs_out_is_redelivered_marked_as_such(bench: Bench) -> None:
    holder, other = bench.queue("t"), bench.queue("t")
    bench.publish("work", "t", headers={tb.HEADER_LEASE: 0.5})  # raised to MIN_TTR
    taken = _get(holder)
    job = int(taken.delivery_tag.split(".")[0])
    assert bench.server.stats_job(job)["ttr"] == tb.MIN_TTR
    assert not taken.delivery_info.get("redelivered")
    assert other.get() is None  # reserved: nobody else gets it ...

    def back() -> Any:
        # The holder stays connected and polls (never touching): beanstalkd 1.12 expires a
        # job reliably only while its holder's connection is active (see the module's doc).
        # Either consumer may get it then.
        return other.get(no_ack=False) or holder.get(no_ack=False)

    again = wait_until(back, WAIT, "the job coming back")  # ... until its TTR is over
    assert again.payload == "work" and again.delivery_info["redelivered"] is True
    assert again.delivery_tag != taken.delivery_tag
    assert bench.server.stats_job(job)["timeouts"] == 1
    taken.ack()  # too late: it is held again, under its new delivery tag
    assert not taken.channel.touch(taken.delivery_tag)
    assert bench.tube("t")["current-jobs-reserved"] == 1
    again.ack()
    assert bench.tube("t")["current-jobs-reserved"] == 0


def test_touching_a_held_job_restarts_its_ttr(bench: Bench) -> None:
    holder = bench.queue("h")
    bench.publish("long", "h", headers={tb.HEADER_LEASE: 3})
    taken = _get(holder)
    job = int(taken.delivery_tag.split(".")[0])
    wait_until(lambda: bench.server.stats_job(job)["time-left"] <= 1, WAIT, "its TTR running")
    assert taken.channel.touch(taken.delivery_tag)
    assert bench.server.stats_job(job)["time-left"] >= 2  # whole seconds, rounded down
    taken.ack()
    assert not taken.channel.touch(taken.delivery_tag)  # settled: nothing to touch
    assert bench.tube("h")["current-jobs-ready"] == 0


def test_requeue_releases_with_the_same_priority_and_redelivered(bench: Bench) -> None:
    queue = bench.queue("r")
    bench.publish("urgent", "r", priority=9)
    bench.publish("plain", "r")
    first = _get(queue)
    first.requeue()
    again = _get(queue)
    assert (again.payload, again.delivery_info["redelivered"]) == ("urgent", True)


# ---- dead letters and poison ------------------------------------------------------------------


def test_a_dead_letter_is_buried_kicked_to_read_and_buried_again(bench: Bench) -> None:
    queue = bench.queue("dead")
    bench.publish("parked", "dead", headers={ext.HEADER_DEAD_REASON: "lost"})
    assert (bench.tube("dead")["current-jobs-buried"], bench.tube("dead")["current-jobs-ready"]) \
        == (1, 0)
    read = queue.get(no_ack=False)  # kicked, reserved
    assert read.payload == "parked" and read.headers[ext.HEADER_DEAD_REASON] == "lost"
    job = int(read.delivery_tag.split(".")[0])
    assert bench.server.stats_job(job)["kicks"] == 1
    read.requeue()
    assert bench.tube("dead")["current-jobs-buried"] == 1
    queue.get(no_ack=False).ack()
    assert bench.tube("dead")["current-jobs-buried"] == 0


def test_a_job_that_is_not_a_kombu_envelope_is_buried_and_consuming_goes_on(
    bench: Bench, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger=tb.__name__)
    queue = bench.queue("bad")
    bench.server.use(tb.tube_name(queue.name))
    bench.server.put(b"\xff not json", priority=0)  # ahead of the good one
    bench.publish("good", "bad")
    got: list[Any] = []
    with bench.connect() as conn, conn.Consumer(queue, callbacks=[
            lambda body, message: (got.append(body), message.ack())]):
        deadline = time.monotonic() + WAIT
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.05)
    assert got == ["good"]
    assert bench.tube("bad")["current-jobs-buried"] == 1
    assert [r for r in caplog.records if "reason=decode-error" in r.getMessage()]


# ---- the worker's heartbeats touch its request ------------------------------------------------


class Naps(task.Task):
    """Sleeps ``seconds`` (the in-process worker below runs this very class)."""

    def execute(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_worker_heartbeats_touch_the_request_so_it_outlives_its_ttr(
    beanstalk_url: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="flowengine.worker_based")
    exchange, topic = f"bt-touch-{uuid.uuid4().hex[:8]}", "naps"
    worker = Worker(exchange=exchange, topic=topic, url=beanstalk_url, threads_count=2,
                    tasks=[Naps])
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert worker.wait(WAIT)
        # A lease of 1.5 s is a TTR of 2 s; the task takes 5 s. Untouched, the job would come
        # back to this (polling) worker, which would hand it back to the engine as redelivered.
        engine = engines.load(Naps("nap", provides="slept", inject={"seconds": 5.0}),
                              engine="worker-based",
                              exchange=exchange, topics=[topic], url=beanstalk_url,
                              lease_timeout=1.5, heartbeat_interval=0.3)
        engine.run()
        assert engine.storage.fetch("slept") == 5.0
    finally:
        worker.stop(grace=5)
        thread.join(WAIT)
        with kombu.Connection(beanstalk_url) as conn, conn.channel() as channel:
            channel.exchange_delete(exchange)
    handed_back = [r.getMessage() for r in caplog.records if "redelivered" in r.getMessage()]
    assert handed_back == []


# ---- the example ------------------------------------------------------------------------------


def test_the_beanstalk_example_runs_a_flow_through_a_tube(beanstalk_url: str) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONIOENCODING="utf-8")
    proc = subprocess.run([sys.executable, str(root / "examples" / "wbe_beanstalk.py"),
                           beanstalk_url], cwd=root, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "result tracking: trk-rsv-widget-2" in lines and "flow state: SUCCESS" in lines
    assert [line for line in lines if re.fullmatch(
        r"tube wbe-beanstalk-\w+_orders: \d+ jobs in all, 0 ready, 0 reserved, 0 buried", line)]
    assert "topic orders: ready=0 running=0 delayed=0 dead=0 workers=1" in lines
    assert lines[-1] == "worker stopped: True"
