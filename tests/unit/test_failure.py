"""Tests for flowengine.types.failure."""

from __future__ import annotations

import copy
import importlib
import json
import sys
from typing import Any

import pytest

from flowengine import exceptions as exc
from flowengine.types.failure import Failure


class VolumeError(RuntimeError):
    """A non-builtin exception, named ``<module>.VolumeError`` in failures."""


VOLUME_ERROR = f"{__name__}.VolumeError"


def _raise_chain() -> BaseException:
    """Return a raised VolumeError explicitly chained from a KeyError chained from an OSError."""
    try:
        try:
            try:
                raise OSError("disk gone")
            except OSError:
                raise KeyError("vol-1") from None
        except KeyError as err:
            raise VolumeError("cannot attach", 42) from err
    except VolumeError as err:
        return err
    raise AssertionError("unreachable")


def _chained() -> BaseException:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as outer:
        return outer


def _capture(error: BaseException) -> Failure:
    try:
        raise error
    except BaseException:
        return Failure()


def test_captures_active_exception() -> None:
    failure = _capture(ValueError("bad", 3))
    assert isinstance(failure.exception, ValueError)
    assert failure.exc_info is not None and failure.exc_info[0] is ValueError
    assert failure.exception_str == "('bad', 3)"
    assert failure.exception_args == ("bad", 3)
    assert failure.exc_type_names == ("ValueError", "Exception")
    assert list(failure) == ["ValueError", "Exception"]
    assert "_capture" in (failure.traceback_str or "")


def test_requires_an_exception() -> None:
    assert sys.exc_info()[0] is None
    with pytest.raises(TypeError, match="exception"):
        Failure()
    with pytest.raises(ValueError, match="three"):
        Failure(exc_info=(ValueError, ValueError()))


def test_base_exceptions_that_are_not_exceptions_are_refused() -> None:
    # TaskFlow's behaviour: KeyboardInterrupt or SystemExit stop the program, not a task.
    with pytest.raises(TypeError, match="^Invalid exception type"):
        Failure.from_exception(KeyboardInterrupt())


def test_non_builtin_type_is_qualified() -> None:
    failure = Failure.from_exception(VolumeError("x"))
    assert failure.exc_type_names == (VOLUME_ERROR, "RuntimeError", "Exception")


def test_causes_follow_cause_and_context_and_respect_suppression() -> None:
    failure = Failure.from_exception(_raise_chain())
    # KeyError was raised "from None", so the OSError context is suppressed.
    assert [c.exc_type_names[0] for c in failure.causes] == ["KeyError"]
    assert failure.causes[0].exception_str == "'vol-1'"
    assert failure.causes[0].causes == ()


def test_implicit_context_chain() -> None:
    try:
        try:
            raise OSError("first")
        except OSError:
            raise ValueError("second")  # noqa: B904 - the implicit context is what is tested
    except ValueError as err:
        failure = Failure.from_exception(err)
    assert [c.exception_str for c in failure.causes] == ["first"]


def test_cause_chain_is_bounded() -> None:
    error: BaseException = RuntimeError("0")
    for i in range(1, 40):
        nxt = RuntimeError(str(i))
        nxt.__cause__ = error
        error = nxt
    failure = Failure.from_exception(error)
    assert len(failure.causes) == 8
    assert len(json.dumps(failure.to_dict())) < 200_000


def test_iter_causes_yields_each_once() -> None:
    error = ValueError("top")
    mid = KeyError("mid")
    mid.__cause__ = OSError("root")
    error.__cause__ = mid
    failure = Failure.from_exception(error)
    assert [c.exception_str for c in failure.iter_causes()] == ["'mid'", "root"]
    decoded = Failure.from_dict(json.loads(json.dumps(failure.to_dict())))
    assert [c.exception_str for c in decoded.iter_causes()] == ["'mid'", "root"]


def test_check_by_class_and_by_name() -> None:
    failure = Failure.from_exception(VolumeError("x"))
    assert failure.check(KeyError, RuntimeError) is RuntimeError
    assert failure.check(VolumeError) is VolumeError
    assert failure.check(VOLUME_ERROR) == VOLUME_ERROR
    assert failure.check("Exception") == "Exception"
    assert failure.check(KeyError, "VolumeError") is None


def test_check_by_name_after_decode_without_importing() -> None:
    data = {
        "exception_str": "quota exceeded",
        "traceback_str": "",
        "exc_type_names": ["remote_only.errors.QuotaError", "RuntimeError", "Exception"],
        "version": 1,
        "exc_args": ["quota exceeded"],
        "causes": [],
    }
    failure = Failure.from_dict(data)
    assert "remote_only" not in sys.modules
    assert failure.exception is None and failure.exc_info is None
    assert failure.check("remote_only.errors.QuotaError") == "remote_only.errors.QuotaError"
    assert failure.check(RuntimeError) is RuntimeError


def test_reraise_original_exception() -> None:
    original = ValueError("v")
    failure = _capture(original)
    with pytest.raises(ValueError) as info:
        failure.reraise()
    assert info.value is original


def test_reraise_decoded_failure_raises_wrapped_failure() -> None:
    failure = Failure.from_dict(Failure.from_exception(ValueError("v")).to_dict())
    with pytest.raises(exc.WrappedFailure) as info:
        failure.reraise()
    assert list(info.value) == [failure]
    assert info.value.check(ValueError) is ValueError


def test_reraise_if_any() -> None:
    Failure.reraise_if_any([])
    Failure.reraise_if_any(iter(()))
    one = Failure.from_exception(KeyError("k"))
    with pytest.raises(KeyError):
        Failure.reraise_if_any([one])
    two = Failure.from_exception(ValueError("v"))
    with pytest.raises(exc.WrappedFailure) as info:
        Failure.reraise_if_any(iter([one, two]))
    assert len(info.value) == 2


def test_equality_and_matches() -> None:
    failure = _capture(ValueError("v"))
    assert failure == failure.copy()
    assert not (failure != failure.copy())
    decoded = Failure.from_dict(failure.to_dict())
    assert decoded != failure  # one has an exception object, the other does not
    assert decoded.matches(failure) and failure.matches(decoded)
    assert not failure.matches(Failure.from_exception(ValueError("other")))
    assert not failure.matches("not a failure")
    with pytest.raises(TypeError):
        hash(failure)


def test_pformat() -> None:
    failure = _capture(ValueError("v"))
    assert failure.pformat() == "Failure: ValueError: v" == str(failure)
    text = failure.pformat(traceback=True)
    assert text.startswith("Failure: ValueError: v\nTraceback (most recent call last):\n")
    assert "_capture" in text
    no_tb = Failure(exception_str="x", exc_type_names=["Exception"], traceback_str="")
    assert no_tb.pformat(traceback=True) == "Failure: Exception: x\nTraceback not available."


def test_round_trip_through_json() -> None:
    failure = Failure.from_exception(_raise_chain())
    data = failure.to_dict()
    wire = json.loads(json.dumps(data))
    Failure.validate(wire)
    decoded = Failure.from_dict(wire)
    assert json.loads(json.dumps(decoded.to_dict())) == wire
    assert decoded.exc_type_names == failure.exc_type_names
    assert decoded.exception_args == ("cannot attach", 42)
    assert decoded.causes[0].check(KeyError) is KeyError
    assert decoded.matches(Failure.from_dict(wire))


def test_to_dict_shape() -> None:
    data = Failure.from_exception(ValueError("v", 1)).to_dict()
    assert set(data) == {
        "exception_str", "traceback_str", "exc_type_names", "version", "exc_args", "causes"
    }
    assert data["version"] == 1
    assert data["exc_args"] == ("v", 1)  # a tuple, as TaskFlow's (JSON turns it into a list)
    assert Failure.from_exception(ValueError("v")).to_dict(include_args=False)["exc_args"] == ()


def test_to_dict_is_json_serializable_with_unserializable_args() -> None:
    marker = object()
    failure = Failure.from_exception(RuntimeError(marker, {"ok": [1, (2, 3)]}, {1: "int key"}))
    data = failure.to_dict()
    encoded = json.dumps(data)
    args = json.loads(encoded)["exc_args"]
    assert args[0] == repr(marker)
    assert args[1] == {"ok": [1, [2, 3]]}
    assert args[2] == repr({1: "int key"})
    assert failure.exception_args[0] is marker  # the in-process failure keeps the real args


def test_taskflow_to_dict_matches() -> None:
    tf_failure = importlib.import_module("taskflow.types.failure")  # a test dependency
    error = _raise_chain()
    ours = Failure.from_exception(error).to_dict()
    theirs = tf_failure.Failure.from_exception(error).to_dict()
    # TaskFlow leaves exc_args as a tuple; on the wire (JSON) both are arrays.
    assert json.loads(json.dumps(ours)) == json.loads(json.dumps(theirs))
    # And each side decodes the other's payload into an equivalent failure.
    assert tf_failure.Failure.from_dict(ours).to_dict()["exc_type_names"] == [
        VOLUME_ERROR, "RuntimeError", "Exception"
    ]
    assert Failure.from_dict(theirs).matches(Failure.from_dict(ours))


def test_from_dict_rejects_unknown_versions_and_ignores_unknown_fields() -> None:
    data = Failure.from_exception(ValueError("v")).to_dict()
    with pytest.raises(ValueError, match="version.*2"):
        Failure.from_dict({**data, "version": 2})
    without = dict(data)
    del without["version"]
    with pytest.raises(ValueError, match="None"):
        Failure.from_dict(without)
    # TaskFlow's schema allows extra fields; they are data and never reach the constructor.
    decoded = Failure.from_dict({**data, "exc_info": ["os.system", "rm"], "extra": 1})
    assert decoded.exc_info is None and decoded.exception_str == "v"
    nested = _capture(_chained())
    cause_without_version = nested.to_dict()
    del cause_without_version["causes"][0]["version"]
    assert Failure.from_dict(cause_without_version).causes[0].exception_str
    try:
        raise KeyError("being handled")
    except KeyError:
        with pytest.raises(TypeError, match="exception_str"):
            Failure.from_dict({"version": 1})


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("exception_str"), "exception_str"),
        (lambda d: d.update(exc_type_names=[]), "exc_type_names|short|non-empty"),
        (lambda d: d.update(exc_type_names=["ValueError"]), "not 'ValueError'"),
        (lambda d: d["causes"].append({**d, "exc_type_names": ["X"], "causes": []}), "'X'"),
        (lambda d: d.update(version="1"), "version|'1'"),
    ],
)
def test_validate_rejects(mutate: Any, message: str) -> None:
    data = copy.deepcopy(Failure.from_exception(ValueError("v")).to_dict())
    mutate(data)
    with pytest.raises(exc.InvalidFormat, match=message):
        Failure.validate(data)


def test_validator_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import jsonschema

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("validator rebuilt per call")

    monkeypatch.setattr(jsonschema.validators, "extend", forbidden)
    Failure.validate(Failure.from_exception(ValueError("v")).to_dict())


def test_copy_is_equal_but_holds_another_exception_object() -> None:
    failure = _capture(ValueError("v"))
    clone = failure.copy()
    assert clone == failure
    assert clone.exception is not failure.exception
    assert clone.traceback_str == failure.traceback_str


def test_redacted_masks_everywhere() -> None:
    secret = "s3cr3t-token"
    try:
        try:
            raise ConnectionError(f"amqp://user:{secret}@host")
        except ConnectionError as err:
            raise VolumeError(f"login failed with {secret}", {"password": secret}) from err
    except VolumeError:
        failure = Failure()
    redacted = failure.redacted([secret, ""])
    encoded = json.dumps(redacted.to_dict())
    assert secret not in encoded and secret not in redacted.pformat(traceback=True)
    assert redacted.exception_str.startswith("('login failed with ***'")
    assert redacted.exception_args == ("login failed with ***", {"password": "***"})
    assert redacted.causes[0].exception_str == "amqp://user:***@host"
    assert redacted.exception is None
    assert redacted.check(VolumeError) is VolumeError
    with pytest.raises(exc.WrappedFailure):
        redacted.reraise()
    assert secret in failure.exception_str  # the original is untouched


def test_redacted_masks_longest_secret_first() -> None:
    failure = Failure.from_exception(ValueError("key=abcdef"))
    assert failure.redacted(["abc", "abcdef"]).exception_str == "key=***"


def test_redacted_masks_reprs_of_other_objects() -> None:
    class Holder:
        def __repr__(self) -> str:
            return "Holder(pw=hunter2)"

    failure = Failure.from_exception(ValueError(Holder()))
    assert failure.redacted(["hunter2"]).exception_args == ("Holder(pw=***)",)
