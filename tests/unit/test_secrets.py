"""Arguments marked secret never reach stored failures (local engines and the worker path)."""

from __future__ import annotations

import json

import pytest

from flowengine import engines, secrets, task
from flowengine.engines import executor as ex
from flowengine.flows import linear_flow as lf
from flowengine.types.failure import Failure

PASSWORD = "hunter2-very-secret"


class Login(task.Task):
    secret_args = ("password",)

    def execute(self, user: str, password: str) -> None:
        raise PermissionError(f"login of {user} with {password} refused", password)

    def revert(self, user: str, password: str, **kwargs: object) -> None:
        raise RuntimeError(f"cannot undo login with {password}")


def test_secret_arguments_are_masked_in_stored_failures() -> None:
    engine = engines.load(lf.Flow("f").add(Login()),
                          store={"user": "bob", "password": PASSWORD})
    with pytest.raises(Exception) as caught:
        engine.run()
    failures = list(engine.storage.get_execute_failures().values())
    failures += engine.storage.get_revert_failures().values()
    assert failures
    for failure in failures:
        dumped = json.dumps(failure.to_dict())
        assert PASSWORD not in dumped
        assert "***" in failure.exception_str
    assert PASSWORD not in str(caught.value)
    stored_failures = [(ad.to_dict()["failure"], ad.to_dict()["revert_failure"])
                       for ad in engine.storage.flow_detail]
    assert PASSWORD not in json.dumps(stored_failures, default=str)


def test_the_executor_redacts_what_workers_send_back() -> None:
    # Workers run tasks through this same function, so their replies are redacted too.
    _outcome, failure = ex.execute_task(Login(), {"user": "bob", "password": PASSWORD})
    assert isinstance(failure, Failure)
    assert PASSWORD not in json.dumps(failure.to_dict())
    assert failure.check(PermissionError)


SECRET = "s3cr'et\"\\Ω\n🔑"


def _forms(value: str) -> list[str]:
    """The secret as programs print and store it: escaped once, twice and three times."""
    once = [value, repr(value), json.dumps(value), json.dumps(value, ensure_ascii=False),
            ascii(value), str([value]), str({"k": value}), repr((value,)), f"{value!r:>40}"]
    twice = [json.dumps(form) for form in once] + [repr(form) for form in once]
    return once + twice + [repr(json.dumps(form)) for form in once]


@pytest.mark.parametrize("form", _forms(SECRET))
def test_every_encoding_of_a_secret_is_masked(form: str) -> None:
    masked = secrets.Masker([SECRET]).text(f"before {form} after")
    assert "s3cr" not in masked and "***" in masked
    assert masked.startswith("before ") and masked.endswith(" after")


def test_values_are_masked_inside_structures_keeping_their_shape() -> None:
    masker = secrets.Masker([secrets.Secret({"pw": SECRET, "pin": 4321})])
    data = {"dsn": f"db://u:{SECRET}@h", "pin": 4321, "items": (SECRET, 1), "ok": True}
    assert masker.value(data) == {"dsn": "db://u:***@h", "pin": "***", "items": ("***", 1),
                                  "ok": True}
    assert masker.found_in(repr(data)) and not masker.found_in("nothing here")


def test_a_secret_never_shows_through_its_wrapper() -> None:
    wrapped = secrets.Secret(SECRET)
    assert "s3cr" not in f"{wrapped} {wrapped!r} {[wrapped]}"
    assert wrapped.reveal() == SECRET == secrets.reveal(wrapped) == secrets.reveal(SECRET)


def test_names_read_into_secret_args_are_found_through_rebinding() -> None:
    flow = lf.Flow("f").add(Login(rebind={"password": "db_password"}))
    assert secrets.secret_sources(flow) == {"db_password"}


def test_the_dashboard_and_failures_mask_with_the_same_function() -> None:
    from flowengine.dashboard.masking import mask_text

    text = f"failed with {SECRET!r} in {json.dumps([SECRET])}"
    assert mask_text(text, [SECRET]) == secrets.mask_text(text, [SECRET])
    failure = Failure.from_exception(RuntimeError(text)).redacted([SECRET])
    assert "s3cr" not in json.dumps(failure.to_dict())
