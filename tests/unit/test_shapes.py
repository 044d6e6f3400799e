"""Resuming a stored flow with code that changed shape: refused with the difference, unless a
migration is registered; ``flowengine check --backend`` says which stored flows cannot resume."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import shape_flows
from click.testing import CliRunner

from flowengine import engines, migrations, states
from flowengine.cli.main import cli
from flowengine.persistence import backends, models

FACTORY = "shape_flows.make_order"


@pytest.fixture
def backend_uri(tmp_path: Path) -> Iterator[str]:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    shape_flows.CODE.update(charge=False, version=(1, 0))
    shape_flows.RAN.clear()
    yield uri
    for registered in (FACTORY, "order"):
        migrations.unregister_migration(registered)


def _stored(uri: str) -> models.FlowDetail:
    backend = backends.fetch(uri)
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            [book] = list(conn.get_logbooks())
            [flow_detail] = list(book)
            return flow_detail
    finally:
        backend.close()


def _interrupted(uri: str) -> models.FlowDetail:
    """The order flow, stored by today's code, suspended once ``reserve`` ran."""
    backend = backends.fetch(uri)
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
        book = models.LogBook("orders")
        engine = engines.load_from_factory(FACTORY, book=book, backend=backend)
        for _state in engine.run_iter():
            if engine.storage.get_atom_state("reserve") == states.SUCCESS:
                engine.suspend()
        assert engine.storage.get_flow_state() == states.SUSPENDED
    finally:
        backend.close()
    return _stored(uri)


def _resume(uri: str) -> Any:
    backend = backends.fetch(uri)
    try:
        engine = engines.load_from_detail(_stored(uri), backend=backend)
        engine.run()
        return engine
    finally:
        backend.close()


def _check(uri: str) -> Any:
    return CliRunner().invoke(cli, ["check", "--backend", uri])


def test_a_flow_whose_code_gained_an_atom_resumes_only_once_a_migration_is_registered(
        backend_uri: str) -> None:
    stored = _interrupted(backend_uri)
    assert shape_flows.RAN == ["reserve"]
    assert sorted(stored.meta[migrations.META_SHAPE]["atoms"]) == ["reserve", "ship"]
    shape_flows.CODE["charge"] = True  # the deploy
    with pytest.raises(migrations.FlowShapeChanged) as caught:
        _resume(backend_uri)
    message = str(caught.value)
    assert message.startswith(f"Flow 'order' ({stored.uuid}) cannot be resumed")
    assert "added atom 'charge' (shape_flows.Step 1.0)" in message
    assert "added link 'reserve' -> 'charge'" in message
    assert f"register_migration({FACTORY!r}, ...)" in message
    # Refused before anything was written: no record of the new atom, nothing ran.
    assert sorted(ad.name for ad in _stored(backend_uri) if not ad.name.startswith("_")) == [
        "reserve", "ship"]
    assert shape_flows.RAN == ["reserve"]
    checked = _check(backend_uri)
    assert checked.exit_code == 1, checked.output
    assert f"CANNOT RESUME: flow 'order' ({stored.uuid}, SUSPENDED)" in checked.output
    assert "added atom 'charge'" in checked.output

    migrations.register_migration(FACTORY)
    assert _check(backend_uri).exit_code == 0
    engine = _resume(backend_uri)
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert shape_flows.RAN == ["reserve", "charge", "ship"]
    assert sorted(_stored(backend_uri).meta[migrations.META_SHAPE]["atoms"]) == [
        "charge", "reserve", "ship"]


def test_a_migration_adjusts_the_stored_flow_before_it_runs(backend_uri: str) -> None:
    _interrupted(backend_uri)
    shape_flows.CODE["charge"] = True
    seen: list[migrations.ShapeChange] = []

    def already_charged(change: migrations.ShapeChange, storage: Any) -> None:
        seen.append(change)
        storage.set_atom_state("charge", states.IGNORE)  # charged by hand meanwhile

    migrations.register_migration("order", already_charged)  # by the flow's name
    _resume(backend_uri)
    assert list(seen[0].added) == ["charge"] and not seen[0].removed
    assert shape_flows.RAN == ["reserve", "ship"]


def test_a_major_version_change_is_a_change_and_a_minor_one_is_not(backend_uri: str) -> None:
    _interrupted(backend_uri)
    shape_flows.CODE["version"] = (1, 3)
    assert _check(backend_uri).exit_code == 0
    shape_flows.CODE["version"] = (2, 0)
    checked = _check(backend_uri)
    assert checked.exit_code == 1
    assert ("changed atom 'ship': shape_flows.Step 1.0 -> shape_flows.Step 2.0"
            in checked.output), checked.output


def test_a_stored_flow_that_never_ran_takes_the_new_shape(backend_uri: str) -> None:
    backend = backends.fetch(backend_uri)
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
        engine = engines.load_from_factory(FACTORY, book=models.LogBook("orders"),
                                           backend=backend)
        engine.prepare()
        engine.storage.flow_meta[migrations.META_SHAPE] = migrations.shape_of(
            engine.compilation)
        engine.storage.update_flow_metadata({})
    finally:
        backend.close()
    shape_flows.CODE["charge"] = True
    assert _resume(backend_uri).storage.get_flow_state() == states.SUCCESS
    assert shape_flows.RAN == ["reserve", "charge", "ship"]
