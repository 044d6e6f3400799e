"""Tests for flowengine.exceptions."""

from __future__ import annotations

import builtins

import pytest
from servers import require_module

from flowengine import exceptions as exc
from flowengine.types.failure import Failure

TASKFLOW_NAMES = [
    "TaskFlowException",
    "StorageFailure",
    "ConductorFailure",
    "JobFailure",
    "UnclaimableJob",
    "ExecutionFailure",
    "RequestTimeout",
    "InvalidState",
    "DependencyFailure",
    "AmbiguousDependency",
    "MissingDependencies",
    "CompilationFailure",
    "IncompatibleVersion",
    "Duplicate",
    "NotFound",
    "Empty",
    "MultipleChoices",
    "InvalidFormat",
    "DisallowedAccess",
    "NotImplementedError",
    "WrappedFailure",
    "raise_with_cause",
]


def test_every_taskflow_name_is_exported() -> None:
    missing = [name for name in TASKFLOW_NAMES if name not in exc.__all__]
    assert missing == []


@pytest.mark.parametrize(
    ("child", "parent"),
    [
        (exc.StorageFailure, exc.TaskFlowException),
        (exc.BackendError, exc.StorageFailure),
        (exc.UnclaimableJob, exc.JobFailure),
        (exc.RequestTimeout, exc.ExecutionFailure),
        (exc.InvalidState, exc.ExecutionFailure),
        (exc.WorkerLost, exc.ExecutionFailure),
        (exc.TaskTimeLimitExceeded, exc.ExecutionFailure),
        (exc.MissingDependencies, exc.DependencyFailure),
        (exc.AmbiguousDependency, exc.DependencyFailure),
        (exc.DisallowedAccess, exc.TaskFlowException),
        (exc.NotImplementedError, builtins.NotImplementedError),
    ],
)
def test_hierarchy(child: type, parent: type) -> None:
    assert issubclass(child, parent)


def test_wrapped_failure_is_not_a_taskflow_exception() -> None:
    assert not issubclass(exc.WrappedFailure, exc.TaskFlowException)


def test_hierarchy_matches_taskflow() -> None:
    tf_exc = require_module("taskflow.exceptions")
    for name in TASKFLOW_NAMES:
        ours, theirs = getattr(exc, name), getattr(tf_exc, name)
        if not isinstance(ours, type):
            continue
        our_bases = [b.__name__ for b in ours.__bases__]
        their_bases = [b.__name__ for b in theirs.__bases__]
        assert our_bases == their_bases, name


def test_cause_and_message() -> None:
    root = ValueError("root")
    err = exc.StorageFailure("cannot save flow 'f1'", cause=root)
    assert err.cause is root
    assert err.args == ("cannot save flow 'f1'",)
    assert str(err).splitlines() == ["cannot save flow 'f1'", "  ValueError: root"]


def test_pformat_follows_taskflow_causes_and_stops_at_foreign_ones() -> None:
    inner_foreign = KeyError("never shown")
    foreign = ValueError("root")
    foreign.cause = inner_foreign  # type: ignore[attr-defined]
    err = exc.StorageFailure("outer", cause=exc.NotFound("mid", cause=foreign))
    assert err.pformat(show_root_class=True) == (
        "StorageFailure: outer\n  NotFound: mid\n    ValueError: root"
    )
    assert err.pformat(indent=1, indent_text="-") == "outer\n-NotFound: mid\n--ValueError: root"


def test_pformat_survives_a_cause_cycle() -> None:
    a = exc.NotFound("a")
    b = exc.NotFound("b", cause=a)
    a._cause = b
    assert a.pformat().splitlines() == ["a", "  NotFound: b", "    NotFound: a"]


def test_pformat_rejects_negative_indent() -> None:
    with pytest.raises(ValueError, match="-1"):
        exc.Empty("x").pformat(indent=-1)


def test_missing_dependencies_names_who_and_what() -> None:
    err = exc.MissingDependencies("my-task", ["a", "b"], method="revert")
    assert err.missing_requirements == ["a", "b"]
    assert "my-task" in str(err) and "'a'" in str(err) and "'revert' method" in str(err)


def test_missing_dependencies_message_matches_taskflow() -> None:
    tf_exc = require_module("taskflow.exceptions")
    ours = exc.MissingDependencies("t", ["x"], method="execute")
    theirs = tf_exc.MissingDependencies("t", ["x"], method="execute")
    assert str(ours) == str(theirs)


def test_disallowed_access_keeps_state() -> None:
    err = exc.DisallowedAccess("flow 'f' is suspended", state="SUSPENDED")
    assert err.state == "SUSPENDED"


def test_worker_lost_names_task_attempts_and_workers() -> None:
    err = exc.WorkerLost("resize-volume", 3, ["w1", "w2"])
    assert (err.atom_name, err.attempts, err.worker_ids) == ("resize-volume", 3, ("w1", "w2"))
    text = str(err)
    assert "resize-volume" in text and "3" in text and "w1, w2" in text


def test_time_limit_exceeded_names_task_and_limit() -> None:
    err = exc.TaskTimeLimitExceeded("bill", 2.5, elapsed=2.75)
    assert "bill" in str(err) and "2.5s" in str(err) and "2.750s" in str(err)
    assert err.time_limit == 2.5


def test_raise_with_cause_uses_active_exception() -> None:
    with pytest.raises(exc.StorageFailure) as info:
        try:
            raise OSError("disk full")
        except OSError:
            exc.raise_with_cause(exc.StorageFailure, "cannot save atom 'a'")
    assert isinstance(info.value.cause, OSError)
    assert info.value.__cause__ is info.value.cause


def test_raise_with_cause_explicit_cause_and_extra_kwargs() -> None:
    cause = RuntimeError("x")
    with pytest.raises(exc.DisallowedAccess) as info:
        exc.raise_with_cause(exc.DisallowedAccess, "no", cause=cause, state="FAILURE")
    assert info.value.cause is cause and info.value.state == "FAILURE"


def test_raise_with_cause_without_active_exception() -> None:
    with pytest.raises(exc.NotFound) as info:
        exc.raise_with_cause(exc.NotFound, "flow 'f' not found")
    assert info.value.cause is None


def test_raise_with_cause_requires_taskflow_exception() -> None:
    with pytest.raises(ValueError, match="TaskFlowException"):
        exc.raise_with_cause(ValueError, "nope")  # type: ignore[arg-type]


def _failure(error: BaseException) -> Failure:
    return Failure.from_exception(error)


def test_wrapped_failure_sequence_and_check() -> None:
    failures = [_failure(RuntimeError("a")), _failure(KeyError("b"))]
    wrapped = exc.WrappedFailure(failures)
    assert len(wrapped) == 2
    assert list(wrapped) == failures
    assert wrapped[1] is failures[1]
    assert wrapped.check(ValueError, KeyError) is KeyError
    assert wrapped.check("RuntimeError") == "RuntimeError"
    assert wrapped.check(ValueError) is None
    assert wrapped.check() is None
    assert str(wrapped) == "WrappedFailure: [Failure: RuntimeError: a, Failure: KeyError: 'b']"


def test_wrapped_failure_flattens_nested_ones() -> None:
    inner = exc.WrappedFailure([_failure(RuntimeError("a")), _failure(KeyError("b"))])
    outer = exc.WrappedFailure([_failure(inner), _failure(ValueError("c"))])
    assert [f.exception_str for f in outer] == ["a", "'b'", "c"]
