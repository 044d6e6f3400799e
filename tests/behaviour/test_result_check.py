"""Results must be JSON, on every engine and backend; a storage error never fakes an ending.

A result that is not a JSON value fails its atom the moment it is produced (with or without a
backend), and the flow reverts. A backend write that fails mid-run halts the engine
(``RunHalted``): nothing more runs, nothing is reverted, nothing more is written, and the stored
record stays as the last write it accepted, so a resumed run finishes the flow and runs no
completed atom again. The faults are injected at the backend connection (the process edge).
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
    if kind == "mariadb":
        return str(request.getfixturevalue("mariadb_database_url"))
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


def _resume(factory: EngineFactory, flow: linear_flow.Flow, backend: Any, flow_uuid: str) -> Any:
    """A new engine on ``flow``'s stored record in ``backend`` (another process, in effect)."""
    with contextlib.closing(backend.get_connection()) as conn:
        flow_detail = conn.get_flow_details(flow_uuid)
    return factory(flow, backend=backend, flow_detail=flow_detail)


# Parametrized here rather than by the ``stored`` fixture, so that the remote copy of this
# scenario (tests/integration/test_wbe_engine_suite.py) runs it on every backend too.
@pytest.mark.parametrize("backend_kind", BACKENDS)
@pytest.mark.parametrize("trigger", [f"atom b {states.SUCCESS}", f"atom b {states.RUNNING}"])
def test_a_failed_write_halts_the_engine_and_a_resume_finishes_the_flow(
        engine_factory: EngineFactory, backend_kind: str, trigger: str,
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    with _opened(backend_kind, request, tmp_path) as backend:
        _check_halted_then_resumed(engine_factory, backend, trigger)


def _check_halted_then_resumed(engine_factory: EngineFactory, backend: Any, trigger: str) -> None:
    fault = _Fault(trigger, stays_down=False)
    engine = engine_factory(_three_steps(), backend=_FlakyBackend(backend, fault))
    with pytest.raises(exc.RunHalted, match="unreachable"):
        engine.run()
    assert fault.failed == [trigger]
    ran_b = trigger.endswith(states.SUCCESS)
    assert tasks.names("execute") == (["a", "b"] if ran_b else ["a"])
    assert tasks.names("revert") == [], "a revert that cannot be recorded must not run"
    flow_uuid = engine.storage.flow_uuid
    # As after a crash: b's RUNNING is stored (or not, if that was the write that failed).
    assert _stored(backend, flow_uuid) == {
        "flow": states.RUNNING, "a": states.SUCCESS,
        "b": states.RUNNING if ran_b else states.PENDING, "c": states.PENDING}
    _resume(engine_factory, _three_steps(), backend, flow_uuid).run()
    assert tasks.names("execute") == (["a", "b", "b", "c"] if ran_b else ["a", "b", "c"])
    assert tasks.names("revert") == []
    assert _stored(backend, flow_uuid) == {
        "flow": states.SUCCESS, "a": states.SUCCESS, "b": states.SUCCESS, "c": states.SUCCESS}


def test_a_backend_that_stays_down_is_not_written_again_until_the_engine_runs_again(
        engine_factory: EngineFactory, stored: Any) -> None:
    backend = stored
    fault = _Fault(f"atom b {states.SUCCESS}", stays_down=True)
    engine = engine_factory(_three_steps(), backend=_FlakyBackend(backend, fault))
    with pytest.raises(exc.RunHalted, match="unreachable"):
        engine.run()
    assert fault.failed == [f"atom b {states.SUCCESS}"], "nothing is written after the halt"
    assert tasks.names("revert") == []
    assert _stored(backend, engine.storage.flow_uuid)["b"] == states.RUNNING
    with pytest.raises(exc.StorageFailure, match="could not be saved"):
        engine.run()  # still down: what it did must be written before anything more runs
    assert tasks.names("execute") == ["a", "b"]
    fault.stays_down = False
    fault.down = False
    engine.run()  # b's outcome, known in memory, is written first: b does not run again
    assert tasks.names("execute") == ["a", "b", "c"]
    assert _stored(backend, engine.storage.flow_uuid) == {
        "flow": states.SUCCESS, "a": states.SUCCESS, "b": states.SUCCESS, "c": states.SUCCESS}


def _three_steps() -> linear_flow.Flow:
    return linear_flow.Flow("three").add(tasks.Step("a"), tasks.Step("b"), tasks.Step("c"))


def test_a_failure_that_cannot_be_stored_halts_and_a_resume_reverts(
        local_engine_factory: EngineFactory, stored: Any) -> None:
    fault = _Fault(f"atom boom {states.FAILURE}", stays_down=False)

    def flow() -> linear_flow.Flow:
        return linear_flow.Flow("f").add(tasks.Step("a"), tasks.Fail("boom"))

    engine = local_engine_factory(flow(), backend=_FlakyBackend(stored, fault))
    with pytest.raises(exc.RunHalted, match="boom"):
        engine.run()
    assert fault.failed == [f"atom boom {states.FAILURE}"]
    assert tasks.names("revert") == []
    flow_uuid = engine.storage.flow_uuid
    assert _stored(stored, flow_uuid) == {
        "flow": states.RUNNING, "a": states.SUCCESS, "boom": states.RUNNING}
    resumed = _resume(local_engine_factory, flow(), stored, flow_uuid)
    with pytest.raises(tasks.Boom, match="boom failed"):
        resumed.run()  # boom runs again, fails again, and this time the flow reverts
    assert tasks.names("revert") == ["boom", "a"]
    assert _stored(stored, flow_uuid)["flow"] == states.REVERTED
