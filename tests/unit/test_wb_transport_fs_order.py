"""flowengine-fs delivers the highest priority first, FIFO within a priority."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
from manual_clock import ManualClock

from flowengine.worker_based.broker import transport_fs_files, transport_fs_order

EXCHANGE = kombu.Exchange("jobs", type="direct", durable=True)
WORK = kombu.Queue("jobs_work", EXCHANGE, routing_key="work", durable=True)


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[kombu.Connection]:
    with kombu.Connection("flowengine-fs://localhost",
                          transport_options={"data_folder": str(tmp_path / "fs")}) as connection:
        yield connection


def publish(conn: kombu.Connection, body: Any, priority: int | None = None) -> None:
    conn.Producer(serializer="json").publish(body, exchange=EXCHANGE, routing_key="work",
                                             declare=[WORK], priority=priority)


def take(channel: Any) -> Any:
    message = WORK(channel).get(no_ack=True, accept=["application/json"])
    return None if message is None else message.payload


def test_ranked_names_keep_their_stamp_and_sort_most_urgent_first() -> None:
    stamp = transport_fs_files.Stamper().next_name()
    names = [transport_fs_order.ranked(stamp, 9 - priority) for priority in (0, 9, 4)]
    assert [transport_fs_order.stamp_of(name) for name in names] == [stamp] * 3
    assert sorted(names) == [names[1], names[2], names[0]]
    assert transport_fs_order.stamp_of(stamp) == stamp  # a name written before ranks


def test_an_urgent_message_overtakes_a_listed_backlog_once_the_listing_is_stale(
        conn: kombu.Connection) -> None:
    channel = conn.channel()
    clock = ManualClock()
    channel.clock = clock
    for n in range(3):
        publish(conn, {"n": n})
    assert take(channel) == {"n": 0}  # lists the queue: three names
    publish(conn, {"n": "urgent"}, priority=9)
    assert take(channel) == {"n": 1}  # still the listing: it is fresh
    clock.advance(transport_fs_order.RELIST_INTERVAL)
    assert [take(channel) for _ in range(3)] == [{"n": "urgent"}, {"n": 2}, None]


def test_expiration_still_reads_the_stamp_of_a_ranked_name(conn: kombu.Connection) -> None:
    stamp = transport_fs_files.Stamper().next_name()
    ranked = transport_fs_order.ranked(stamp, 0)
    assert not transport_fs_files.expired(ranked, 60_000)
    sent_long_ago = transport_fs_order.ranked(f"{1:020d}.1.0000000000.msg", 0)
    assert transport_fs_files.expired(sent_long_ago, 1)
