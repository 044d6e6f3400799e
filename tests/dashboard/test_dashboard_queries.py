"""Paginated, filtered flow listings (persistence.queries) on SQL and on the other backends."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_store import open_store

from flowengine.persistence import backends, base, models
from flowengine.persistence.queries import FlowCursor, FlowQuery, find_flows


@pytest.fixture(params=["sqlite", "memory", "postgresql",
                        pytest.param("mariadb", marks=pytest.mark.cluster)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[base.Backend]:
    if request.param == "sqlite":
        found = open_store(tmp_path / "q.db")
    elif request.param == "memory":
        found = backends.fetch("memory://")
    else:  # a real server: the SQL queries must mean the same on PostgreSQL and MariaDB
        found = backends.fetch(request.getfixturevalue(
            "mariadb_database_url" if request.param == "mariadb" else "postgres_schema_url"))
        with contextlib.closing(found.get_connection()) as conn:
            conn.upgrade()
    book = models.LogBook("book")
    for index in range(12):
        fd = models.FlowDetail(f"flow-{index % 3}_x" if index != 5 else "odd%name",
                               f"{index:02d}-uuid")
        fd.state = "SUCCESS" if index % 2 else "FAILURE"
        book.add(fd)
    with contextlib.closing(found.get_connection()) as conn:
        conn.save_logbook(book)
    yield found
    found.close()


def test_filters_combine_and_count_every_match(backend: base.Backend) -> None:
    page = find_flows(backend, FlowQuery(states=("SUCCESS",), limit=3))
    assert page.total == 6 and len(page.rows) == 3
    assert {row.state for row in page.rows} == {"SUCCESS"}
    assert {row.book for row in page.rows} == {"book"}
    named = find_flows(backend, FlowQuery(name="FLOW-1"))
    assert sorted(row.uuid for row in named.rows) == ["01-uuid", "04-uuid", "07-uuid", "10-uuid"]
    assert [r.uuid for r in find_flows(backend, FlowQuery(uuid="1")).rows] == [
        "11-uuid", "10-uuid"]


def test_pattern_characters_are_matched_literally(backend: base.Backend) -> None:
    assert [r.uuid for r in find_flows(backend, FlowQuery(name="%")).rows] == ["05-uuid"]
    assert find_flows(backend, FlowQuery(name="_x")).total == 11
    assert find_flows(backend, FlowQuery(uuid="_")).total == 0


def test_pages_do_not_overlap_and_cover_everything(backend: base.Backend) -> None:
    seen = [r.uuid for offset in (0, 5, 10)
            for r in find_flows(backend, FlowQuery(offset=offset, limit=5)).rows]
    assert sorted(seen) == [f"{i:02d}-uuid" for i in range(12)]


def test_cursors_page_like_offsets_both_ways(backend: base.Backend) -> None:
    by_offset = [find_flows(backend, FlowQuery(offset=offset, limit=5)).rows
                 for offset in (0, 5, 10)]
    first = find_flows(backend, FlowQuery(limit=5))
    second = find_flows(backend, FlowQuery(limit=5, after=first.last))
    third = find_flows(backend, FlowQuery(limit=5, after=second.last))
    assert [first.rows, second.rows, third.rows] == by_offset
    assert third.total == 12 and len(third.rows) == 2
    back = find_flows(backend, FlowQuery(limit=5, before=third.first))
    assert back.rows == second.rows
    assert find_flows(backend, FlowQuery(limit=5, before=second.first)).rows == first.rows
    filtered = find_flows(backend, FlowQuery(states=("SUCCESS",), limit=2))
    rest = find_flows(backend, FlowQuery(states=("SUCCESS",), limit=5, after=filtered.last))
    assert {r.state for r in rest.rows} == {"SUCCESS"} and len(rest.rows) == 4


def test_a_cursor_reads_back_and_a_bad_one_is_named() -> None:
    cursor = FlowCursor(datetime.datetime(2026, 1, 31, 12, 0, 1, 5), "a~b")
    assert FlowCursor.parse(cursor.text()) == cursor
    with pytest.raises(ValueError, match="'nonsense' is not <ISO time>~<flow uuid>"):
        FlowCursor.parse("nonsense")
    with pytest.raises(ValueError, match="not both"):
        FlowQuery(after=cursor, before=cursor)


def test_time_window(backend: base.Backend) -> None:
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    assert find_flows(backend, FlowQuery(since=now - datetime.timedelta(hours=1))).total == 12
    assert find_flows(backend, FlowQuery(since=now + datetime.timedelta(hours=1))).total == 0
    assert find_flows(backend, FlowQuery(until=now - datetime.timedelta(hours=1))).total == 0


def test_bad_pages_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="limit"):
        FlowQuery(limit=0)
    with pytest.raises(ValueError, match="offset"):
        FlowQuery(offset=-1)
