"""Logbook, flow detail and atom detail semantics (TaskFlow's), without any backend."""

from __future__ import annotations

import datetime
import json

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models
from flowengine.types.failure import Failure


def _failure(message: str = "boom") -> Failure:
    try:
        raise ValueError(message)
    except ValueError:
        return Failure()


# ---- LogBook ---------------------------------------------------------------------------------


def test_logbook_defaults_and_generated_uuid() -> None:
    book = models.LogBook("jobs")
    assert book.name == "jobs"
    assert len(book.uuid) == 36 and models.LogBook("jobs").uuid != book.uuid
    assert models.LogBook("jobs", uuid="fixed").uuid == "fixed"
    assert book.meta == {} and book.updated_at is None
    assert isinstance(book.created_at, datetime.datetime) and book.created_at.tzinfo is None


def test_logbook_add_find_iterate() -> None:
    book = models.LogBook("jobs")
    first, second = models.FlowDetail("a", "fa"), models.FlowDetail("b", "fb")
    book.add(first)
    book.add(second)
    book.add(models.FlowDetail("a2", "fa"))  # same uuid replaces
    assert len(book) == 2
    assert [fd.name for fd in book] == ["a2", "b"]
    assert book.find("fb") is second and book.find("nope") is None
    assert book.updated_at is not None


def test_logbook_dict_round_trip_with_marshalled_time() -> None:
    book = models.LogBook("jobs")
    book.meta = {"k": [1]}
    book.add(models.FlowDetail("a", "fa"))
    data = book.to_dict(marshal_time=True)
    assert set(data) == {"name", "meta", "uuid", "updated_at", "created_at"}
    assert book.created_at is not None
    assert data["created_at"]["year"] == book.created_at.year
    json.dumps(data)  # what the file backends write
    back = models.LogBook.from_dict(data, unmarshal_time=True)
    assert (back.uuid, back.meta, back.created_at, back.updated_at) == (
        book.uuid,
        book.meta,
        book.created_at,
        book.updated_at,
    )
    assert len(back) == 0  # contents are never part of the dict
    assert models.LogBook.from_dict({**book.to_dict(), "meta": None}).meta == {}


def test_logbook_merge_and_copy() -> None:
    book, other = models.LogBook("a", uuid="u"), models.LogBook("a", uuid="u")
    other.meta = {"deep": {"x": 1}}
    assert book.merge(other) is book and book.meta is other.meta
    assert book.merge(other, deep_copy=True).meta is other.meta  # equal: nothing taken
    third = models.LogBook("a", uuid="u")
    third.meta = {"deep": {"x": 2}}
    assert book.merge(third, deep_copy=True).meta is not third.meta

    book.add(models.FlowDetail("f", "fu"))
    shallow = book.copy()
    assert shallow.find("fu") is book.find("fu") and shallow.meta is not book.meta
    assert len(book.copy(retain_contents=False)) == 0


# ---- FlowDetail ------------------------------------------------------------------------------


def test_flow_detail_add_find_update_merge() -> None:
    fd = models.FlowDetail("flow", "fu")
    task = models.TaskDetail("t", "tu")
    fd.add(task)
    assert fd.find("tu") is task and len(fd) == 1 and list(fd) == [task]

    other = models.FlowDetail("flow", "fu")
    other.state, other.meta = states.RUNNING, {"m": 1}
    fd.merge(other)
    assert (fd.state, fd.meta, len(fd)) == (states.RUNNING, {"m": 1}, 1)
    fd.update(other)
    assert len(fd) == 0  # update shares other's atom details

    data = other.to_dict()
    assert data == {"name": "flow", "meta": {"m": 1}, "state": states.RUNNING, "uuid": "fu"}
    assert models.FlowDetail.from_dict(data).state == states.RUNNING
    assert len(fd.copy(retain_contents=False)) == 0


# ---- TaskDetail ------------------------------------------------------------------------------


def test_task_detail_defaults() -> None:
    task = models.TaskDetail("t", "tu")
    assert (task.state, task.intention, task.results, task.failure) == (
        None,
        states.EXECUTE,
        None,
        None,
    )
    assert task.last_results is None and task.version is None and task.meta == {}


def test_task_put_success_failure_revert_sequence() -> None:
    task = models.TaskDetail("t", "tu")
    assert task.put(states.SUCCESS, 5) is True
    assert task.results == 5
    assert task.put(states.SUCCESS, task.results) is False  # same object: unchanged

    failure = _failure()
    assert task.put(states.FAILURE, failure) is True
    assert (task.failure, task.results) == (failure, None)

    assert task.put(states.REVERTED, "undone") is True
    assert task.revert_results == "undone"
    revert_failure = _failure("revert")
    task.put(states.REVERT_FAILURE, revert_failure)
    assert task.revert_failure is revert_failure and task.revert_results is None
    task.put(states.SUCCESS, 6)
    assert (task.failure, task.revert_failure, task.results) == (None, None, 6)


def test_task_reset() -> None:
    task = models.TaskDetail("t", "tu")
    task.put(states.FAILURE, _failure())
    task.intention = states.REVERT
    task.reset(states.PENDING)
    assert (task.state, task.intention, task.failure, task.results) == (
        states.PENDING,
        states.EXECUTE,
        None,
        None,
    )


def test_task_dict_round_trip_keeps_failures() -> None:
    task = models.TaskDetail("t", "tu")
    task.put(states.FAILURE, _failure())
    task.revert_failure = _failure("revert")
    task.version, task.meta, task.intention = (1, 2), {"progress": 1.0}, states.REVERT
    data = json.loads(json.dumps(task.to_dict()))
    assert data["failure"]["version"] == Failure.DICT_VERSION
    back = models.TaskDetail.from_dict(data)
    assert back.failure is not None and back.failure.matches(task.failure)
    assert back.revert_failure is not None and back.revert_failure.exception_str == "revert"
    assert (back.version, back.meta, back.intention) == ([1, 2], {"progress": 1.0}, "REVERT")


def test_task_merge_shares_results_and_copies_failures_when_deep() -> None:
    task, other = models.TaskDetail("t", "tu"), models.TaskDetail("t", "tu")
    other.put(states.SUCCESS, {"big": [1]})
    other.failure = _failure()
    task.merge(other)
    assert task.results is other.results and task.failure is other.failure
    deep = models.TaskDetail("t", "tu").merge(other, deep_copy=True)
    assert deep.results is other.results  # results are never copied
    assert deep.failure is not other.failure and deep.failure == other.failure
    with pytest.raises(exc.NotImplementedError):
        task.merge(models.RetryDetail("r", "ru"))


def test_task_copy_and_update() -> None:
    task = models.TaskDetail("t", "tu")
    task.put(states.SUCCESS, [1])
    task.meta["a"] = 1
    clone = task.copy()
    assert clone.results is task.results and clone.meta == task.meta
    clone.meta["a"] = 2
    assert task.meta["a"] == 1
    fresh = models.TaskDetail("t", "tu").update(task)
    assert fresh.results is task.results and fresh.state == states.SUCCESS


# ---- RetryDetail -----------------------------------------------------------------------------


def test_retry_history_accumulates_until_reset() -> None:
    retry = models.RetryDetail("r", "ru")
    with pytest.raises(exc.NotFound):
        _ = retry.last_results
    with pytest.raises(exc.NotFound):
        _ = retry.last_failures
    retry.put(states.SUCCESS, "first")
    retry.results[-1][1]["task"] = _failure()
    retry.put(states.SUCCESS, "second")
    assert [data for data, _ in retry.results] == ["first", "second"]
    assert retry.last_results == "second" and retry.last_failures == {}
    retry.put(states.FAILURE, _failure())
    assert len(retry.results) == 2  # failures do not clear the history
    retry.reset(states.PENDING)
    assert retry.results == [] and retry.failure is None


def test_retry_dict_round_trip_keeps_history_data_and_failures() -> None:
    retry = models.RetryDetail("r", "ru")
    retry.put(states.SUCCESS, {"attempt": 1})
    retry.results[-1][1]["task"] = _failure("first")
    retry.put(states.REVERTED, "undone")
    back = models.RetryDetail.from_dict(json.loads(json.dumps(retry.to_dict())))
    assert back.results[0][0] == {"attempt": 1}
    assert back.results[0][1]["task"].exception_str == "first"
    assert back.revert_results == "undone"


def test_retry_merge_and_copy_rebuild_history() -> None:
    retry, other = models.RetryDetail("r", "ru"), models.RetryDetail("r", "ru")
    other.put(states.SUCCESS, [1])
    other.results[-1][1]["t"] = _failure()
    other.revert_results = "undone"
    retry.merge(other, deep_copy=True)
    assert retry.results[0][0] is other.results[0][0]
    assert retry.results[0][1]["t"] == other.results[0][1]["t"]
    assert retry.results[0][1] is not other.results[0][1]
    assert retry.revert_results == "undone"
    clone = retry.copy()
    assert clone.results == retry.results and clone.results is not retry.results
    with pytest.raises(exc.NotImplementedError):
        retry.merge(models.TaskDetail("t", "tu"))


# ---- type names ------------------------------------------------------------------------------


def test_atom_type_names() -> None:
    assert sorted(models.ATOM_TYPES) == ["RETRY_DETAIL", "TASK_DETAIL"]
    assert models.atom_detail_class("TASK_DETAIL") is models.TaskDetail
    assert models.atom_detail_type(models.RetryDetail("r", "ru")) == "RETRY_DETAIL"
    with pytest.raises(TypeError, match="BOGUS"):
        models.atom_detail_class("BOGUS")
    with pytest.raises(TypeError):
        models.atom_detail_type(object())  # type: ignore[arg-type]


def test_pformat_describes_the_tree() -> None:
    book = models.LogBook("jobs")
    fd = models.FlowDetail("flow", "fu")
    task = models.TaskDetail("t", "tu")
    task.version, task.meta = (1, 0), {"progress": 0.5}
    fd.add(task)
    book.add(fd)
    text = book.pformat()
    for expected in ("LogBook: 'jobs'", "FlowDetail: 'flow'", "TaskDetail: 't'", "1.0", "50.00%"):
        assert expected in text


def test_times_travel_with_copy_merge_and_update_but_not_to_dict() -> None:
    fd = models.FlowDetail("f", "fu")
    fd.times = {states.RUNNING: 1.0}
    ad = models.RetryDetail("r", "ru")
    ad.times = {states.RUNNING: 2.0, states.SUCCESS: 3.0}
    fd.add(ad)
    assert "times" not in fd.to_dict() and "times" not in ad.to_dict()
    assert models.FlowDetail.from_dict(fd.to_dict()).times == {}
    assert models.RetryDetail.from_dict(ad.to_dict()).times == {}
    copied = ad.copy()
    assert copied.times == ad.times and copied.times is not ad.times
    assert fd.copy().times == {states.RUNNING: 1.0}
    other = models.RetryDetail("r", "ru")
    assert other.merge(ad).times == ad.times
    other.times[states.FAILURE] = 4.0
    assert states.FAILURE not in ad.times  # merged times are a copy
    stored = models.FlowDetail("f", "fu")
    assert stored.merge(fd).times == fd.times
    assert models.TaskDetail("t", "tu").update(models.TaskDetail("t", "tu")).times == {}
    assert "times" not in fd.pformat() and "times" not in ad.pformat()
