"""Tests for flowengine's filesystem kombu transport (``flowengine-fs://``)."""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest

from flowengine.worker_based.broker import transport_fs, transport_fs_doorbell, transport_fs_files

EXCHANGE = kombu.Exchange("jobs", type="direct", durable=True)
WORK = kombu.Queue("jobs_work", EXCHANGE, routing_key="work", durable=True)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "fs"


@pytest.fixture
def conn(folder: Path) -> Iterator[kombu.Connection]:
    with kombu.Connection(
        "flowengine-fs://localhost", transport_options={"data_folder": str(folder)}
    ) as connection:
        yield connection


def publish(conn: kombu.Connection, bodies: list[Any], declare: bool = True) -> None:
    producer = conn.Producer(serializer="json")
    for body in bodies:
        producer.publish(
            body, exchange=EXCHANGE, routing_key="work", declare=[WORK] if declare else []
        )


def consume(conn: kombu.Connection, count: int, ack: bool = True,
            redelivered: list[bool] | None = None) -> list[Any]:  # fmt: skip
    got: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        if redelivered is not None:
            redelivered.append(bool(message.delivery_info.get("redelivered")))
        if ack:
            message.ack()

    with conn.Consumer([WORK], callbacks=[on_message], accept=["application/json"]):
        while len(got) < count:
            conn.drain_events(timeout=5)
    return got


def test_names_sort_in_send_order_even_when_the_clock_stalls_or_goes_back() -> None:
    ticks = iter([5, 5, 5, 3, 7])
    stamper = transport_fs_files.Stamper(clock=lambda: next(ticks))
    names = [stamper.next_name() for _ in range(5)]
    assert names == sorted(names) and len(set(names)) == 5


def test_fifo_within_a_sender(conn: kombu.Connection) -> None:
    publish(conn, [{"n": n} for n in range(300)])
    assert consume(conn, 300) == [{"n": n} for n in range(300)]


def test_polling_is_brisk_by_default(conn: kombu.Connection) -> None:
    assert conn.transport.polling_interval == transport_fs.DEFAULT_POLLING_INTERVAL <= 0.01


def test_ack_settles_and_no_message_is_left_behind(conn: kombu.Connection, folder: Path) -> None:
    publish(conn, [{"n": 1}])
    consume(conn, 1)
    assert list((folder / "queues" / "jobs_work").iterdir()) == []
    assert list((folder / "claimed").rglob("*.msg")) == []


def test_unacked_messages_return_to_their_queue_in_order(folder: Path) -> None:
    options = {"data_folder": str(folder)}
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as first:
        publish(first, [{"n": n} for n in range(3)])
        assert consume(first, 2, ack=False) == [{"n": 0}, {"n": 1}]
        assert len(list((folder / "claimed").rglob("*.msg"))) == 2
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as second:
        flags: list[bool] = []
        assert consume(second, 3, redelivered=flags) == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert flags == [True, True, False], "given back means redelivered, as on AMQP"


def test_claims_of_a_live_process_are_left_alone(folder: Path) -> None:
    options = {"data_folder": str(folder), "recover_interval": 0}
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as first:
        publish(first, [{"n": 0}])
        assert first.default_channel._get("jobs_work") is not None  # claimed, never acked
        with kombu.Connection("flowengine-fs://localhost", transport_options=options) as second:
            with pytest.raises(queue.Empty):
                second.default_channel._get("jobs_work")
        assert len(list((folder / "claimed").rglob("*.msg"))) == 1


def test_requeue_puts_a_message_back_at_its_place(conn: kombu.Connection) -> None:
    publish(conn, [{"n": 0}, {"n": 1}])
    seen: list[Any] = []
    flags: list[bool] = []

    def on_message(body: Any, message: Any) -> None:
        seen.append(body)
        flags.append(bool(message.delivery_info.get("redelivered")))
        if len(seen) == 1:
            message.requeue()
        else:
            message.ack()

    with conn.Consumer([WORK], callbacks=[on_message], accept=["application/json"]):
        while len(seen) < 3:
            conn.drain_events(timeout=5)
    assert seen == [{"n": 0}, {"n": 0}, {"n": 1}]
    assert flags == [False, True, False]


def test_routing_uses_bindings_other_processes_stored(folder: Path) -> None:
    options = {"data_folder": str(folder)}
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as consumer:
        WORK(consumer.default_channel).declare()
        fanout = kombu.Exchange("announce", type="fanout", durable=True)
        listener = kombu.Queue("jobs_listener", fanout, durable=True)
        listener(consumer.default_channel).declare()
        # A second connection has its own in-memory broker state: only the files are shared.
        with kombu.Connection("flowengine-fs://localhost", transport_options=options) as sender:
            publish(sender, [{"direct": True}], declare=False)
            sender.Producer(serializer="json").publish({"fanout": True}, exchange="announce")
        assert consume(consumer, 1) == [{"direct": True}]
        message = listener(consumer.default_channel).get(no_ack=True)
        assert message is not None and message.payload == {"fanout": True}


def test_undecodable_files_are_moved_aside_and_consuming_goes_on(
    conn: kombu.Connection, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    WORK(conn.default_channel).declare()
    queue_dir = folder / "queues" / "jobs_work"
    (queue_dir / "00000000000000000001.1.0000000000.msg").write_bytes(b'{"not": "an envelope"')
    (queue_dir / "00000000000000000002.1.0000000000.msg").write_bytes(b'{"properties": 1}')
    publish(conn, [{"n": "after"}])
    with caplog.at_level(logging.WARNING):
        assert consume(conn, 1) == [{"n": "after"}]
    assert len(list((folder / "bad" / "jobs_work").iterdir())) == 2
    assert caplog.text.count("reason=decode-error") == 2


def test_expired_messages_are_dropped(conn: kombu.Connection, folder: Path) -> None:
    producer = conn.Producer(serializer="json")
    producer.publish({"n": "stale"}, exchange=EXCHANGE, routing_key="work", declare=[WORK],
                     expiration=0.001)  # fmt: skip
    producer.publish({"n": "fresh"}, exchange=EXCHANGE, routing_key="work", expiration=3600)
    # Published long ago, as far as the stale message's name says.
    queue_dir = folder / "queues" / "jobs_work"
    stale = sorted(queue_dir.iterdir())[0]
    stale.rename(queue_dir / ("0" * 20 + stale.name[20:]))
    assert consume(conn, 1) == [{"n": "fresh"}]
    assert list(queue_dir.iterdir()) == []


def test_a_half_written_message_is_never_read(
    conn: kombu.Connection, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    WORK(conn.default_channel).declare()
    half_written, release = threading.Event(), threading.Event()
    real_write = transport_fs.Channel._write_file

    def slow_write(self: transport_fs.Channel, path: Path, data: bytes) -> None:
        with open(path, "wb") as handle:
            handle.write(data[: len(data) // 2])
            handle.flush()
            half_written.set()
            assert release.wait(10)
            handle.write(data[len(data) // 2 :])

    monkeypatch.setattr(transport_fs.Channel, "_write_file", slow_write)
    writer = threading.Thread(target=publish, args=(conn.clone(), [{"n": "whole"}]))
    writer.start()
    try:
        assert half_written.wait(10)
        reader = conn.default_channel
        with pytest.raises(queue.Empty):
            reader._get("jobs_work")
        assert list((folder / "queues" / "jobs_work").iterdir()) == []
        assert len(list((folder / "tmp").iterdir())) == 1
    finally:
        release.set()
        writer.join(10)
    monkeypatch.setattr(transport_fs.Channel, "_write_file", real_write)
    assert consume(conn, 1) == [{"n": "whole"}]


def test_claims_of_a_dead_process_are_requeued(folder: Path) -> None:
    options = {"data_folder": str(folder)}
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as first:
        publish(first, [{"n": "orphan"}])
        claimed = first.default_channel._get("jobs_work")
        assert claimed is not None
    # Pretend a process that has exited held the claim.
    mine = folder / "claimed" / str(os.getpid())
    mine.rename(folder / "claimed" / dead.stdout.strip())
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as second:
        flags: list[bool] = []
        assert consume(second, 1, redelivered=flags) == [{"n": "orphan"}]
        assert flags == [True]


CHILD = """
import json, sys, kombu
import flowengine.worker_based.broker.transport_fs
exchange = kombu.Exchange("jobs", type="direct", durable=True)
work = kombu.Queue("jobs_work", exchange, routing_key="work", durable=True)
got, done = [], []
def on_message(body, message):
    message.ack()
    if body.get("stop"):
        done.append(True)
    else:
        got.append(body["n"])
with kombu.Connection("flowengine-fs://localhost",
                      transport_options={"data_folder": sys.argv[1]}) as conn:
    with conn.Consumer([work], callbacks=[on_message], accept=["application/json"]):
        print("ready", flush=True)
        while not done:
            try:
                conn.drain_events(timeout=1)
            except TimeoutError:
                pass
print(json.dumps(got), flush=True)
"""


def test_competing_processes_consume_each_message_exactly_once(
    conn: kombu.Connection, folder: Path
) -> None:
    WORK(conn.default_channel).declare()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(folder)], stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        for _ in range(2)
    ]
    lines: queue.Queue[tuple[int, str]] = queue.Queue()

    def forward(index: int, out: Any) -> None:
        for line in out:
            lines.put((index, line))

    for index, child in enumerate(children):
        threading.Thread(target=forward, args=(index, child.stdout), daemon=True).start()
    try:
        assert sorted(lines.get(timeout=30) for _ in children) == [(0, "ready\n"), (1, "ready\n")]
        publish(conn, [{"n": n} for n in range(1000)] + [{"stop": True}, {"stop": True}])
        results = dict(lines.get(timeout=60) for _ in children)
        assert [child.wait(30) for child in children] == [0, 0]
    finally:
        for child in children:
            child.kill() if child.poll() is None else None
    consumed = [json.loads(results[0]), json.loads(results[1])]
    assert sorted(consumed[0] + consumed[1]) == list(range(1000))
    assert consumed[0] and consumed[1], "both processes should have won some messages"
    # Each process saw its share in send order.
    assert all(share == sorted(share) for share in consumed)


# -- doorbells: a waiting consumer wakes when a message lands, not at its next poll -----------

#: Longer than any test waits: a delivery within the test's wait must have been rung.
SLOW_POLL = {"polling_interval": 60}
needs_doorbells = pytest.mark.skipif(
    not transport_fs_doorbell.SUPPORTED, reason="doorbells need Linux; elsewhere consumers poll"
)


def waiting(transport: Any, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set each time ``transport``'s consumer starts waiting between scans."""
    entered = threading.Event()
    real_wait = transport.bell.wait

    def wait(timeout: float, rung: bool = True) -> bool:
        entered.set()
        return bool(real_wait(timeout, rung))

    monkeypatch.setattr(transport.bell, "wait", wait)
    return entered


@needs_doorbells
def test_a_waiting_consumer_is_rung_by_the_publisher(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {"data_folder": str(folder), **SLOW_POLL}
    got: queue.Queue[Any] = queue.Queue()
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as consumer:
        WORK(consumer.default_channel).declare()
        entered = waiting(consumer.transport, monkeypatch)
        callbacks = [lambda body, message: (got.put(body), message.ack())]
        with consumer.Consumer([WORK], callbacks=callbacks, accept=["application/json"]):
            drainer = threading.Thread(target=consumer.drain_events, kwargs={"timeout": 30})
            drainer.start()
            assert entered.wait(10), "the consumer never waited"
            with kombu.Connection("flowengine-fs://localhost", transport_options=options) as other:
                publish(other, [{"n": "rung"}], declare=False)
            assert got.get(timeout=10) == {"n": "rung"}, "not rung: it would have slept 60 s"
            drainer.join(10)


def test_a_settlement_wakes_a_consumer_waiting_for_room(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {"data_folder": str(folder), **SLOW_POLL}
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as conn:
        publish(conn, [{"n": 0}, {"n": 1}])
        got: queue.Queue[Any] = queue.Queue()
        consumer = conn.Consumer([WORK], callbacks=[lambda body, message: got.put(message)],
                                 accept=["application/json"], prefetch_count=1)  # fmt: skip
        with consumer:
            conn.drain_events(timeout=10)
            first = got.get_nowait()
            entered = waiting(conn.transport, monkeypatch)
            drainer = threading.Thread(target=conn.drain_events, kwargs={"timeout": 30})
            drainer.start()
            assert entered.wait(10), "the consumer never waited"
            first.ack()  # from another thread, as a worker's task thread does
            second = got.get(timeout=10)
            assert second.payload == {"n": 1}, "not woken: it would have slept 60 s"
            second.ack()
            drainer.join(10)


@needs_doorbells
def test_a_ring_nobody_answers_removes_the_registration(
    conn: kombu.Connection, folder: Path
) -> None:
    WORK(conn.default_channel).declare()
    bells = folder / transport_fs_doorbell.BELLS / "jobs_work"
    bells.mkdir(parents=True)
    (bells / f"{os.getpid()}.gone").touch()  # a consumer that closed its socket and crashed
    publish(conn, [{"n": 1}], declare=False)
    assert not bells.exists()
    assert consume(conn, 1) == [{"n": 1}]


@needs_doorbells
def test_a_publisher_finds_a_consumer_registered_after_it_looked(tmp_path: Path) -> None:
    now = [10**18]
    ringer = transport_fs_doorbell.Ringer(str(tmp_path), clock=lambda: now[0])
    first, later = (transport_fs_doorbell.Doorbell(str(tmp_path)) for _ in range(2))
    try:
        first.register("q")
        folder = tmp_path / transport_fs_doorbell.BELLS / "q"
        old = now[0] - 10 * transport_fs_doorbell.SETTLE_NS
        os.utime(folder, ns=(old, old))  # listed long after its last change: trusted
        ringer.ring("q")
        assert first.wait(0) and not later.wait(0)
        later.register("q")  # the folder changes; the publisher's list is now stale
        now[0] += transport_fs_doorbell.RECHECK_NS
        ringer.ring("q")
        assert first.wait(0) and later.wait(0)
    finally:
        for bell in (first, later):
            bell.close()
        ringer.close()
    assert not (tmp_path / transport_fs_doorbell.BELLS / "q").exists(), "close unregisters"


def test_leftovers_of_dead_processes_are_swept(folder: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    options = {"data_folder": str(folder), "recover_interval": 0}
    with kombu.Connection("flowengine-fs://localhost", transport_options=options) as conn:
        WORK(conn.default_channel).declare()
        live = transport_fs_doorbell.Doorbell(str(folder))
        live.register("jobs_work")
        bells = folder / transport_fs_doorbell.BELLS / "jobs_work"
        bells.mkdir(parents=True, exist_ok=True)
        (bells / f"{dead}.abc").touch()
        taken = folder / transport_fs_files.SHARED / f"{dead}.7{transport_fs_files.TAKEN}"
        taken.touch()
        claims = folder / "claimed" / dead / "jobs_work"
        claims.mkdir(parents=True)
        (claims / f"{transport_fs_files.SPARE_PREFIX}3").touch()
        with pytest.raises(queue.Empty):
            conn.default_channel._get("jobs_work")
        registered = [p.name for p in bells.iterdir()] if bells.exists() else []
        live.close()
    assert registered == ([live._token] if transport_fs_doorbell.SUPPORTED else [])
    assert not taken.exists()
    assert not (folder / "claimed" / dead).exists()


# -- spares: settled message files are reused, not deleted ----------------------------------


def queued_files(folder: Path) -> list[Path]:
    return sorted((folder / "queues" / "jobs_work").iterdir())


def test_a_settled_message_file_carries_the_next_message(
    conn: kombu.Connection, folder: Path
) -> None:
    publish(conn, [{"n": "x" * 9000}])
    inode = queued_files(folder)[0].stat().st_ino
    consume(conn, 1)
    for body in ({"n": "x" * 7000}, {"n": "short"}):  # padded, then truncated
        publish(conn, [body])
        [path] = queued_files(folder)
        assert path.stat().st_ino == inode, "a new file was created"
        assert consume(conn, 1) == [body]


def test_fifo_holds_while_files_are_recycled(conn: kombu.Connection) -> None:
    publish(conn, [{"n": n} for n in range(50)])
    first = consume(conn, 25)
    publish(conn, [{"n": n} for n in range(50, 100)])
    assert first + consume(conn, 75) == [{"n": n} for n in range(100)]


def test_spares_pass_between_processes_and_each_goes_to_one(tmp_path: Path) -> None:
    (tmp_path / transport_fs_files.SHARED).mkdir()
    settled = tmp_path / "settled.msg"
    settled.write_bytes(b"{}")
    giver = transport_fs_files.Spares(str(tmp_path), own_limit=0)
    takers = [transport_fs_files.Spares(str(tmp_path)) for _ in range(2)]
    giver.keep(str(settled), 2)
    assert not settled.exists()
    taken = [taker.take() for taker in takers]
    assert sorted(taken, key=bool)[0] is None, "one spare went to two takers"
    [(path, size)] = [spare for spare in taken if spare is not None]
    # Blanked before it was offered: a consumed body is not readable from a spare.
    assert size == 2 and Path(path).read_bytes() == b"  "


def test_spares_are_bounded_in_number_and_size(tmp_path: Path) -> None:
    (tmp_path / transport_fs_files.SHARED).mkdir()
    spares = transport_fs_files.Spares(str(tmp_path), own_limit=1, shared_limit=1)
    sizes = [10, 10, 10, transport_fs_files.SPARE_MAX_BYTES + 1]
    for n, size in enumerate(sizes):
        (tmp_path / f"{n}.msg").write_bytes(b"x" * size)
    for n, size in enumerate(sizes):
        spares.keep(str(tmp_path / f"{n}.msg"), size)
    # One kept, one offered, the rest deleted.
    assert len(list(tmp_path.glob(f"{transport_fs_files.SPARE_PREFIX}*"))) == 1
    assert len(list((tmp_path / transport_fs_files.SHARED).iterdir())) == 1
    assert list(tmp_path.glob("*.msg")) == []


def test_a_forked_child_does_not_write_over_its_parents_spares(tmp_path: Path) -> None:
    settled = tmp_path / "settled.msg"
    settled.write_bytes(b"{}")
    transport_fs_files.spares(str(tmp_path)).keep(str(settled), 2)
    pid = os.fork()
    if pid == 0:  # the child: exit status says what it found
        os._exit(0 if transport_fs_files.spares(str(tmp_path)).take() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child took its parent's spare"
    assert transport_fs_files.spares(str(tmp_path)).take() is not None
