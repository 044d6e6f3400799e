"""Fencing tokens in the store, on every backend: a write made under an older claim than one
that has written to the flow is refused, in the same transaction as the write; writes without
a token are never refused and never lower the flow's token; TaskFlow's records are unchanged.

(The conductors' side, two conductors on one stored flow, is tests/jobs/test_fencing_tokens.py.)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from store_kinds import KINDS, store_url

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import backends, base, models
from flowengine.persistence._store import StoreConnection
from flowengine.persistence.backends._sql import migrations, tables
from flowengine.persistence.backends._sql.engine import normalize_url

OLDER, NEWER = 1_764_000_000_000_001, 1_764_000_000_000_002


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[base.Backend]:
    made = backends.fetch(store_url(kind, request, tmp_path))
    with contextlib.closing(made.get_connection()) as conn:
        conn.upgrade()
    yield made
    made.close()


def _saved(backend: base.Backend, flow_uuid: str = "flow-1") -> models.FlowDetail:
    """A logbook with one flow of two atoms, saved; the flow detail."""
    book = models.LogBook("book", uuid=f"book-of-{flow_uuid}")
    fd = models.FlowDetail("flow", flow_uuid)
    for name in ("first", "second"):
        fd.add(models.TaskDetail(name, f"{flow_uuid}-{name}"))
    book.add(fd)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)
    return fd


def _connection(backend: base.Backend) -> StoreConnection:
    conn = backend.get_connection()
    assert isinstance(conn, StoreConnection)
    return conn


def _atom(fd: models.FlowDetail, name: str) -> models.AtomDetail:
    return next(ad for ad in fd if ad.name == name)


def test_a_write_under_an_older_claim_is_refused_once_a_newer_one_wrote(
        backend: base.Backend) -> None:
    fd = _saved(backend)
    plain = _connection(backend)
    older, newer = plain.fenced(fd.uuid, OLDER), plain.fenced(fd.uuid, NEWER)
    older.record_fencing_token()
    first = _atom(fd, "first")
    first.state, first.results = states.SUCCESS, "by the older claim"
    older.update_atom_details(first)  # nobody newer has written: taken
    newer.record_fencing_token()
    first.results = "the older claim, woken late"
    with pytest.raises(base.FencedOff, match=rf"atom 'first'.*claim token {NEWER}.*{OLDER}"):
        older.update_atom_details(first)
    fd.state = states.SUCCESS
    with pytest.raises(base.FencedOff, match=rf"flow 'flow'.*claim token {NEWER}"):
        older.update_flow_details(fd)
    with pytest.raises(base.FencedOff):
        older.update_flow_fields(fd)
    with pytest.raises(base.FencedOff):
        older.record_fencing_token()
    stored = plain.get_flow_details(fd.uuid)
    assert stored.state is None and stored.fencing_token == NEWER
    assert _atom(stored, "first").results == "by the older claim"
    second = _atom(fd, "second")
    second.state = states.RUNNING
    newer.update_atom_details(second)  # the newer claim goes on
    assert _atom(plain.get_flow_details(fd.uuid), "second").state == states.RUNNING


def test_a_token_is_recorded_by_any_write_and_never_goes_down(backend: base.Backend) -> None:
    fd = _saved(backend)
    plain = _connection(backend)
    first = _atom(fd, "first")
    first.state = states.RUNNING
    plain.fenced(fd.uuid, NEWER).update_atom_details(first)
    assert plain.get_flow_details(fd.uuid).fencing_token == NEWER
    # Writes without a token (an engine of `flowengine run`, an operator) are never refused,
    # and a stale copy they save does not lower the token.
    stale = models.FlowDetail("flow", fd.uuid)
    stale.state, stale.fencing_token = states.RUNNING, OLDER
    plain.update_flow_details(stale)
    plain.update_flow_fields(stale)
    plain.update_atom_details(first)
    plain.change_flow_meta(fd.uuid, lambda stored: stored.meta.update(note="operator"))
    stored = plain.get_flow_details(fd.uuid)
    assert (stored.state, stored.meta, stored.fencing_token) == (
        states.RUNNING, {"note": "operator"}, NEWER)
    with pytest.raises(base.FencedOff):
        plain.fenced(fd.uuid, OLDER).update_atom_details(first)


def test_a_fenced_connection_writes_its_own_flow_only(backend: base.Backend) -> None:
    fd, other = _saved(backend), _saved(backend, "flow-2")
    fenced = _connection(backend).fenced(fd.uuid, NEWER)
    with pytest.raises(base.FencedOff, match="not part of flow detail 'flow-1'"):
        fenced.update_atom_details(_atom(other, "first"))
    with pytest.raises(base.FencedOff, match="not part of flow detail 'flow-1'"):
        fenced.update_flow_details(other)
    with pytest.raises(exc.NotFound, match="no atom detail with uuid 'ghost'"):
        fenced.update_atom_details(models.TaskDetail("ghost", "ghost"))
    with pytest.raises(base.FencedOff, match="not part of flow detail 'flow-1'"):
        fenced.destroy_logbook("book-of-flow-1")
    with pytest.raises(ValueError, match="no fencing token"):
        _connection(backend).record_fencing_token()
    assert _connection(backend).get_flow_details(other.uuid).fencing_token is None


def test_taskflow_records_are_unchanged(backend: base.Backend, kind: str,
                                        tmp_path: Path) -> None:
    fd = _saved(backend)
    plain = _connection(backend)
    plain.fenced(fd.uuid, NEWER).record_fencing_token()
    stored = plain.get_flow_details(fd.uuid)
    assert stored.fencing_token == NEWER
    assert stored.to_dict() == {"name": "flow", "meta": {}, "state": None, "uuid": fd.uuid}
    assert "fencing" not in stored.pformat()
    copied = stored.copy()
    assert copied.fencing_token == NEWER
    if kind == "memory":
        assert backend.memory[f"/flow_details/{fd.uuid}"] == stored.to_dict()  # type: ignore[attr-defined]
    if kind == "dir":
        record = json.loads((tmp_path / "records" / "flow_details" / fd.uuid / "metadata")
                            .read_text())
        assert record == {**stored.to_dict(), "fencing_token": NEWER}


def _apply_up_to(engine: sa.Engine, version: int) -> None:
    """Leave the database as a release at schema ``version`` would have."""
    schema = tables.define(sa.MetaData()).schema
    with engine.begin() as conn:
        schema.create(conn)
        for migration in migrations.MIGRATIONS[:version]:
            migration.apply(conn)
            conn.execute(sa.insert(schema).values(version=migration.version,
                                                  description=migration.description))


@pytest.mark.parametrize("kind", ["sqlite", "postgresql",
                                  pytest.param("mariadb", marks=pytest.mark.cluster)])
def test_an_upgraded_database_takes_tokens_on_its_older_flows(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = store_url(kind, request, tmp_path)
    raw = sa.create_engine(normalize_url(url))
    try:
        _apply_up_to(raw, 4)
        with raw.begin() as conn:
            conn.execute(sa.text("INSERT INTO logbooks (uuid, name, meta) VALUES ('b', 'b', '{}')"))
            conn.execute(sa.text("INSERT INTO flowdetails (uuid, parent_uuid, name, state, meta)"
                                 " VALUES ('f', 'b', 'flow', 'RUNNING', '{}')"))
        with backends.backend(url) as backend:
            plain = _connection(backend)
            assert plain.get_flow_details("f").fencing_token is None
            plain.fenced("f", NEWER).record_fencing_token()
            with pytest.raises(base.FencedOff):
                plain.fenced("f", OLDER).record_fencing_token()
        columns = {column["name"]: column for column in sa.inspect(raw).get_columns("flowdetails")}
        assert isinstance(columns["fencing_token"]["type"], sa.Integer)
    finally:
        raw.dispose()
