"""Results must be JSON, on every engine and backend; no storage error leaves work unreverted.

A result that is not a JSON value fails its atom the moment it is produced (with or without a
backend), and the flow reverts. A backend write that fails mid-run fails the atom it was for and
the flow reverts what it completed: after a passing fault the records end REVERTED; while the
backend stays down the run still reverts, then raises a StorageFailure saying the records are
stale. The faults are injected at the backend connection (the process edge).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models

from . import tasks
from .harness import EngineFactory
from .test_persistence_contract import BACKENDS

_NO_BACKEND = "none"  # the engine keeps state in memory only


def _uri(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    if kind == "postgresql":
        return str(request.getfixturevalue("postgres_schema_url"))
    return {"memory": "memory://", "dir": f"dir://{tmp_path}/records",
            "sqlite": f"sqlite:///{tmp_path}/records.db"}.get(kind)


@contextlib.contextmanager
def _opened(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    uri = _uri(kind, request, tmp_path)
    if uri is None:
        yield None
        return
    opened = backends.fetch(uri)
    with contextlib.closing(opened.get_connection()) as conn:
        conn.upgrade()
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(params=BACKENDS)
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A persistence backend of each kind."""
    with _opened(request.param, request, tmp_path) as opened:
        yield opened


def _flow() -> linear_flow.Flow:
    return linear_flow.Flow("unstorable").add(tasks.Step("a"), tasks.NotJson("b"),
                                               tasks.Step("c"))


# Parametrized here rather than by a fixture, so that the remote copy of this scenario
# (tests/integration/test_wbe_engine_suite.py) runs it on every backend too.
@pytest.mark.parametrize("backend_kind", [_NO_BACKEND, *BACKENDS])
def test_a_result_that_is_not_json_fails_its_atom_and_reverts(
        engine_factory: EngineFactory, backend_kind: str, request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    with _opened(backend_kind, request, tmp_path) as backend:
        _check_refused(engine_factory, backend)


def _check_refused(engine_factory: EngineFactory, backend: Any) -> None:
    engine = engine_factory(_flow(), backend=backend)
    with pytest.raises(Exception) as raised:
        engine.run()
    message = str(raised.value)
    assert "'b'" in message and "set" in message
    if not engine_factory.remote:
        # The worker refuses it in its own words; locally it is this error.
        assert raised.match("Atom 'b' returned a value of type set, which is not JSON")
    assert tasks.names("execute") == ["a", "b"]
    assert tasks.names("revert") == ["b", "a"]
    storage = engine.storage
    assert storage.get_flow_state() == states.REVERTED
    assert {n: storage.get_atom_state(n) for n in "abc"} == {
        "a": states.REVERTED, "b": states.REVERTED, "c": states.PENDING}
    if not engine_factory.remote:
        # The revert undoes what execute really did, so it receives the value it returned.
        assert tasks.entries("revert")[0]["result"] == {"b"}


class _FlakyConnection:
    """A backend connection whose writes fail once ``fault`` says so."""

    def __init__(self, real: Any, fault: _Fault) -> None:
        self._real = real
        self._fault = fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def update_atom_details(self, ad: models.AtomDetail) -> Any:
        self._fault.check(f"atom {ad.name} {ad.state}")
        return self._real.update_atom_details(ad)

    def update_flow_details(self, fd: models.FlowDetail, *args: Any, **kwargs: Any) -> Any:
        self._fault.check(f"flow {fd.state}")
        return self._real.update_flow_details(fd, *args, **kwargs)

    def update_flow_fields(self, fd: models.FlowDetail) -> Any:
        self._fault.check(f"flow {fd.state}")
        return self._real.update_flow_fields(fd)


class _Fault:
    """Fails the write ``trigger``, then every write while ``down``."""

    def __init__(self, trigger: str, stays_down: bool) -> None:
        self.trigger = trigger
        self.stays_down = stays_down
        self.down = False
        self.failed: list[str] = []
        self._lock = threading.Lock()

    def check(self, write: str) -> None:
        with self._lock:
            if write == self.trigger and not self.failed:
                self.down = True
            elif not self.stays_down:
                self.down = False
            if self.down:
                self.failed.append(write)
                raise ConnectionError(f"backend unreachable (writing {write})")


class _FlakyBackend:
    """Wraps a real backend; its connections fail as ``fault`` says."""

    def __init__(self, real: Any, fault: _Fault) -> None:
        self._real = real
        self._fault = fault

    def get_connection(self) -> _FlakyConnection:
        return _FlakyConnection(self._real.get_connection(), self._fault)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _stored(backend: Any, flow_uuid: str) -> dict[str, str | None]:
    if backend is None:
        return {}
    with contextlib.closing(backend.get_connection()) as conn:
        fd = conn.get_flow_details(flow_uuid)
        return {"flow": fd.state, **{ad.name: ad.state for ad in fd}}


@pytest.mark.parametrize("trigger", [f"atom b {states.SUCCESS}", f"atom b {states.RUNNING}"])
def test_a_failed_write_fails_the_atom_and_the_flow_reverts(
        local_engine_factory: EngineFactory, stored: Any, trigger: str) -> None:
    backend = stored
    fault = _Fault(trigger, stays_down=False)
    engine = local_engine_factory(_three_steps(), backend=_FlakyBackend(backend, fault))
    with pytest.raises(exc.StorageFailure, match="unreachable"):
        engine.run()
    assert fault.failed == [trigger]
    ran_b = trigger.endswith(states.SUCCESS)
    assert tasks.names("execute") == (["a", "b"] if ran_b else ["a"])
    # A failed atom is reverted too (as in TaskFlow); after running, its revert receives what
    # it returned (never stored), otherwise the failure.
    assert tasks.names("revert") == ["b", "a"]
    result = tasks.entries("revert")[0]["result"]
    assert result == "b" if ran_b else "unreachable" in result["failure"]
    assert _stored(backend, engine.storage.flow_uuid) == {
        "flow": states.REVERTED, "a": states.REVERTED, "b": states.REVERTED,
        "c": states.PENDING}


def test_a_backend_that_stays_down_still_reverts_then_says_so(
        local_engine_factory: EngineFactory, stored: Any) -> None:
    backend = stored
    fault = _Fault(f"atom b {states.SUCCESS}", stays_down=True)
    engine = local_engine_factory(_three_steps(), backend=_FlakyBackend(backend, fault))
    with pytest.raises(exc.StorageFailure, match="ended REVERTED, but its records could not"):
        engine.run()
    assert tasks.names("revert") == ["b", "a"]
    assert engine.storage.get_flow_state() == states.REVERTED
    # The backend still holds the last state it accepted; nothing claims it was saved.
    assert _stored(backend, engine.storage.flow_uuid)["b"] == states.RUNNING
    fault.stays_down = False
    fault.down = False
    engine.storage.flush_unsaved()  # once it is back, the whole record is written
    assert _stored(backend, engine.storage.flow_uuid)["b"] == states.REVERTED


def _three_steps() -> linear_flow.Flow:
    return linear_flow.Flow("three").add(tasks.Step("a"), tasks.Step("b"), tasks.Step("c"))


def test_a_failure_that_cannot_be_stored_keeps_its_own_error(
        local_engine_factory: EngineFactory, stored: Any) -> None:
    fault = _Fault(f"atom boom {states.FAILURE}", stays_down=False)
    flow = linear_flow.Flow("f").add(tasks.Step("a"), tasks.Fail("boom"))
    engine = local_engine_factory(flow, backend=_FlakyBackend(stored, fault))
    with pytest.raises(tasks.Boom, match="boom failed"):
        engine.run()
    assert fault.failed == [f"atom boom {states.FAILURE}"]
    assert tasks.names("revert") == ["boom", "a"]
    assert _stored(stored, engine.storage.flow_uuid)["flow"] == states.REVERTED
