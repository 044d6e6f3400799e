"""Tests for flowengine.worker_based.protocol: schemas, message codecs and the request lifecycle."""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any

import jsonschema
import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from taskflow.engines.worker_based import protocol as tf_protocol

from flowengine import exceptions as exc
from flowengine import task
from flowengine.types.failure import Failure
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.wire import request_machine


class Resize(task.Task):
    def execute(self, size: int) -> int:
        return size * 2


def _failure(error: BaseException) -> Failure:
    try:
        raise error
    except BaseException:
        return Failure()


def _request(**kwargs: Any) -> pr.Request:
    return pr.Request(Resize(name="resize"), "corr-1", pr.EXECUTE, {"size": 2}, **kwargs)


def test_execute_request_body_is_taskflows() -> None:
    body = _request().to_dict()
    assert body == {
        "task_cls": f"{__name__}.Resize",
        "task_name": "resize",
        "task_version": [1, 0],
        "action": "execute",
        "arguments": {"size": 2},
    }
    pr.Request.validate(body)
    tf_protocol.Request.validate(json.loads(json.dumps(body)))


def test_revert_request_carries_result_and_failures() -> None:
    failure = _failure(ValueError("disk full"))
    request = pr.Request(
        Resize(name="resize"), "c", pr.REVERT, {"size": 2}, result=failure,
        failures={"resize": failure},
    )  # fmt: skip
    body = json.loads(json.dumps(request.to_dict()))
    assert body["result"][0] == "failure"
    assert body["failures"]["resize"]["exc_type_names"] == ["ValueError", "Exception"]
    pr.Request.validate(body)
    tf_protocol.Request.validate(body)
    work = pr.Request.from_dict(body)
    assert work.action == pr.REVERT
    assert isinstance(work.result, Failure) and work.result.check(ValueError)
    assert work.failures is not None and work.failures["resize"].exception_str == "disk full"


def test_revert_of_a_success_keeps_none_results() -> None:
    request = pr.Request(Resize(name="r"), "c", pr.REVERT, {}, result=None)
    body = request.to_dict()
    assert body["result"] == ["success", None]
    assert pr.Request.from_dict(body).result is None
    assert pr.Request.from_dict(_request().to_dict()).result is pr.NO_RESULT


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"action": "explode"}, "expected format"),
        ({"task_cls": None}, "expected format"),
        ({"result": ["failure"]}, "result"),
        ({"result": ["maybe", 1]}, "result"),
        ({"result": ["failure", {"exception_str": "x"}]}, "Failure data"),
        ({"failures": {"a": {"exception_str": "x", "traceback_str": "", "exc_type_names": []}}},
         "Failure data"),
    ],
)  # fmt: skip
def test_invalid_requests_are_refused(change: dict[str, Any], match: str) -> None:
    body = dict(_request().to_dict(), **change)
    with pytest.raises(exc.InvalidFormat, match=match):
        pr.Request.validate(body)


def test_missing_required_request_field() -> None:
    body = _request().to_dict()
    del body["task_version"]
    with pytest.raises(exc.InvalidFormat, match="task_version"):
        pr.Request.validate(body)


def test_notify_schemas() -> None:
    pr.Notify.validate({}, response=False)
    pr.Notify.validate({"topic": "t", "tasks": ["a.B"]}, response=True)
    with pytest.raises(exc.InvalidFormat):
        pr.Notify.validate({"topic": "t"}, response=False)
    with pytest.raises(exc.InvalidFormat):
        pr.Notify.validate({"topic": "t", "tasks": [], "extra": 1}, response=True)
    reply = pr.Notify(topic="t", tasks=["a.B"])
    assert (reply.topic, reply.tasks, reply.to_dict()) == (
        "t",
        ["a.B"],
        {"topic": "t", "tasks": ["a.B"]},
    )


@pytest.mark.parametrize(
    "body",
    [
        {"state": pr.RUNNING, "data": {}},
        {
            "state": pr.EVENT,
            "data": {"event_type": "update_progress", "details": {"progress": 0.5}},
        },
        {"state": pr.SUCCESS, "data": {"result": [1, "two"]}},
        {"state": pr.SUCCESS, "data": {"result": None}},
    ],
)
def test_valid_responses_pass_both_validators(body: dict[str, Any]) -> None:
    pr.Response.validate(body)
    tf_protocol.Response.validate(body)


def test_failure_response_round_trip() -> None:
    failure = _failure(KeyError("volume"))
    body = json.loads(
        json.dumps(pr.Response(pr.FAILURE, result=pr.failure_to_dict(failure)).to_dict())
    )
    pr.Response.validate(body)
    tf_protocol.Response.validate(body)
    decoded = pr.Response.from_dict(body)
    assert decoded.state == pr.FAILURE
    assert isinstance(decoded.data["result"], Failure)
    assert decoded.data["result"].check(KeyError)


def test_failure_response_validates_its_nested_failure() -> None:
    # TaskFlow checks 'result' at the wrong level and lets this through (and then crashes).
    body = {"state": pr.FAILURE, "data": {"result": {"exception_str": "x"}}}
    tf_protocol.Response.validate(body)
    with pytest.raises(exc.InvalidFormat, match="Failure data"):
        pr.Response.validate(body)


@pytest.mark.parametrize(
    "body",
    [
        {"state": pr.SUCCESS, "data": {}},
        {"state": pr.FAILURE, "data": {}},
        {"state": "DONE", "data": {}},
        {"state": pr.RUNNING, "data": {}, "extra": 1},
        {"state": pr.EVENT, "data": {"event_type": "x"}},
    ],
)
def test_invalid_responses_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(exc.InvalidFormat):
        pr.Response.validate(body)


def test_failure_to_dict_drops_arguments_json_cannot_carry() -> None:
    class Unencodable:
        def to_dict(self, include_args: bool = True) -> dict[str, Any]:
            return {"exception_str": "x", "exc_args": [object()] if include_args else []}

    assert pr.failure_to_dict(Unencodable()) == {"exception_str": "x", "exc_args": []}  # type: ignore[arg-type]
    failure = _failure(ValueError("fine", 3))
    assert list(pr.failure_to_dict(failure)["exc_args"]) == ["fine", 3]


def test_lifecycle_allows_only_the_documented_moves() -> None:
    assert pr.MACHINE.frozen
    assert sorted(pr.MACHINE) == sorted(
        [
            (pr.WAITING, "on_pending", pr.PENDING),
            (pr.WAITING, "on_failure", pr.FAILURE),
            (pr.PENDING, "on_running", pr.RUNNING),
            (pr.PENDING, "on_failure", pr.FAILURE),
            (pr.RUNNING, "on_success", pr.SUCCESS),
            (pr.RUNNING, "on_failure", pr.FAILURE),
        ]
    )
    request = _request()
    assert request.current_state == pr.WAITING
    assert request.transition(pr.PENDING) is True
    assert request.transition(pr.PENDING) is False
    with pytest.raises(exc.InvalidState, match="cannot go from PENDING to SUCCESS"):
        request.transition(pr.SUCCESS)
    assert request.transition(pr.RUNNING) and request.transition(pr.SUCCESS)
    with pytest.raises(exc.InvalidState, match="SUCCESS to FAILURE"):
        request.transition(pr.FAILURE)


def test_refused_move_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    request = _request()
    with caplog.at_level(logging.WARNING, logger=pr.LOG.name):
        assert request.transition_and_log_error(pr.SUCCESS) is False
    assert "cannot go from WAITING to SUCCESS" in caplog.text
    assert request.current_state == pr.WAITING


def test_requests_share_the_one_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a request built a state machine")

    monkeypatch.setattr(pr, "build_a_machine", refuse)
    monkeypatch.setattr(request_machine.machines, "FiniteMachine", refuse)
    first, second = _request(), _request()
    first.transition(pr.PENDING)
    assert (first.current_state, second.current_state) == (pr.PENDING, pr.WAITING)


def test_validators_are_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a validator was compiled per message")

    monkeypatch.setattr(jsonschema.validators, "extend", refuse)
    pr.Request.validate(_request().to_dict())
    pr.Response.validate({"state": pr.RUNNING, "data": {}})
    pr.Notify.validate({}, response=False)


def test_expiry_uses_the_injected_clock() -> None:
    clock = ManualClock(100.0)
    request = _request(timeout=10, clock=clock)
    clock.now += 10
    assert not request.expired
    clock.now += 0.5
    assert request.expired
    request.transition(pr.PENDING)
    assert request.expired
    request.transition(pr.RUNNING)
    assert not request.expired


def test_no_timeout_never_expires() -> None:
    clock = ManualClock(100.0)
    request = _request(timeout=None, clock=clock)
    clock.now += 1e9
    assert not request.expired


def test_result_carries_the_executor_outcome() -> None:
    request = _request()
    request.set_result(4)
    assert request.future.result(timeout=0) == ("executed", 4)
    revert = pr.Request(Resize(name="r"), "c", pr.REVERT, {})
    revert.set_result(None)
    assert revert.future.result(timeout=0) == ("reverted", None)


def test_attempts_have_their_own_ids() -> None:
    first, second = _request(), _request(attempt=2)
    assert first.request_id != second.request_id
    assert (first.attempt, second.attempt) == (1, 2)
    assert _request(request_id="given").request_id == "given"


def test_unknown_action_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="resize"):
        pr.Request(Resize(name="resize"), "c", "explode", {})


def test_nesting_bound() -> None:
    deep: Any = 1
    for _ in range(pr.MAX_NESTING_DEPTH):
        deep = [deep]
    assert not pr.exceeds_depth(deep)
    assert pr.exceeds_depth({"k": deep})
    assert not pr.exceeds_depth("scalar")
    assert not pr.exceeds_depth({"a": [1, {"b": 2}]}, limit=3)
    assert pr.exceeds_depth({"a": [1, {"b": []}]}, limit=3)


def test_task_class_name_is_fully_qualified() -> None:
    assert pr.task_class_name(Resize) == f"{__name__}.Resize"
    assert pr.task_class_name(Resize()) == f"{__name__}.Resize"


def test_origin_names_this_process_and_a_forked_child_its_own() -> None:
    assert pr.origin() == f"{socket.gethostname()}:{os.getpid()}"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports its origin and leaves without running pytest's teardown
        os.write(write, pr.origin().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        assert pipe.read().decode() == f"{socket.gethostname()}:{pid}"
    assert pr.origin() == f"{socket.gethostname()}:{os.getpid()}"
