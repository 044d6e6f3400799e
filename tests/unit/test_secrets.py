"""Arguments marked secret never reach stored failures (local engines and the worker path)."""

from __future__ import annotations

import json

import pytest

from flowengine import engines, task
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
