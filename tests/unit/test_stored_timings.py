"""Every engine records when each flow and atom state change happened, with no listener.

A flow run from service code (``engines.load`` with a backend, no ``flowengine run``, no
timing listener) shows when each atom started and how long it took in ``flowengine show``, in
the order the atoms ran, and on the dashboard's timeline without the page having been open
during the run; its "updated" time is the same in ``flows``, ``show`` and the dashboard. On
every backend: memory, dir, SQLite and PostgreSQL (a memory store cannot be opened by a command
in another process, so there the commands' readers are called on it directly).
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

import pytest
from click.testing import CliRunner
from timed_stores import ORDER, TimedStore

from flowengine import states
from flowengine.cli import records
from flowengine.cli.main import cli
from flowengine.dashboard import DashboardData, EventHub
from flowengine.persistence import queries


def _show(store: TimedStore, flow_uuid: str) -> dict[str, Any]:
    """What ``flowengine show --json`` prints about the flow."""
    if not store.shared:
        fd = store.stored(flow_uuid)
        return {"flow": records.flow_summary(None, fd),
                "atoms": [records.atom_record(ad) for ad in records.atoms_of(fd)]}
    shown = CliRunner().invoke(cli, ["show", flow_uuid, "--json", "--backend", store.url])
    assert shown.exit_code == 0, shown.output
    found: dict[str, Any] = json.loads(shown.output)
    return found


def _listed(store: TimedStore, flow_uuid: str) -> dict[str, Any]:
    """The line of ``flowengine flows --json`` about the flow."""
    if not store.shared:
        return records.flow_summary(store.book_of(flow_uuid), store.stored(flow_uuid))
    listed = CliRunner().invoke(cli, ["flows", "--json", "--backend", store.url])
    assert listed.exit_code == 0, listed.output
    [flow] = [row for row in map(json.loads, listed.output.splitlines())
              if row["uuid"] == flow_uuid]
    return dict(flow)


@pytest.mark.parametrize("engine", ["serial", "parallel"])
def test_show_tells_when_each_atom_of_a_service_run_flow_started_and_took(
        timed_store: TimedStore, engine: str) -> None:
    flow_uuid = timed_store.run(engine)
    atoms = _show(timed_store, flow_uuid)["atoms"]
    assert [atom["name"] for atom in atoms] == ORDER  # the order they ran in
    for atom in atoms:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", atom["started_at"]), atom
        assert atom["duration"] is not None and atom["duration"] >= 0, atom
    if timed_store.shared:  # and as the table a user reads
        shown = CliRunner().invoke(cli, ["show", flow_uuid, "--backend", timed_store.url])
        table = shown.output.split("\n\n")[1].splitlines()
        assert table[0].split()[5:7] == ["STARTED", "DURATION"]
        rows = [line.split() for line in table[1:]]
        assert [row[0] for row in rows] == ORDER
        assert all(row[5] != "-" and row[6] != "-" for row in rows), rows


def test_a_reverted_flow_records_its_reverts_and_flow_states(timed_store: TimedStore) -> None:
    flow_uuid = timed_store.run("serial", fail=True)
    fd = timed_store.stored(flow_uuid)
    assert fd.state == states.REVERTED
    assert fd.times[states.RUNNING] <= fd.times[states.REVERTED]
    zeta = next(ad for ad in fd if ad.name == "zeta")
    assert (zeta.times[states.RUNNING] <= zeta.times[states.SUCCESS]
            <= zeta.times[states.REVERTING] <= zeta.times[states.REVERTED])
    boom = next(ad for ad in fd if ad.name == "boom")
    assert boom.times[states.RUNNING] <= boom.times[states.FAILURE]
    shown = {atom["name"]: atom for atom in _show(timed_store, flow_uuid)["atoms"]}
    assert shown["zeta"]["revert_duration"] is not None
    assert list(shown) == [*ORDER, "boom"]


def test_updated_is_one_time_in_flows_show_and_the_dashboard(timed_store: TimedStore) -> None:
    flow_uuid = timed_store.run("serial")
    listed = _listed(timed_store, flow_uuid)
    shown = _show(timed_store, flow_uuid)["flow"]
    data = DashboardData(timed_store.backend, EventHub(None))
    view = data.flow(flow_uuid)
    assert view is not None
    [row] = [row for row in data.flows(queries.FlowQuery()).rows if row.uuid == flow_uuid]
    ended = timed_store.stored(flow_uuid).times[states.SUCCESS]  # the flow's last change
    assert listed["updated_at"] == shown["updated_at"] == view.summary["updated_at"]
    assert listed["updated_at"] == datetime.datetime.fromtimestamp(ended, datetime.UTC) \
        .isoformat(timespec="milliseconds").replace("+00:00", "Z")
    # The dashboard's list pages through the same time (the SQL backend writes it as the flow
    # row's updated_at, the others compute it the same way).
    assert row.updated_at is not None
    assert row.updated_at.replace(tzinfo=datetime.UTC).timestamp() == pytest.approx(ended,
                                                                                    abs=1e-6)


def test_the_dashboard_timeline_comes_from_what_was_stored(timed_store: TimedStore) -> None:
    flow_uuid = timed_store.run("parallel")
    view = DashboardData(timed_store.backend, EventHub(None)).flow(flow_uuid)  # nothing heard
    assert view is not None and view.timeline is not None
    assert [row.name for row in view.timeline.rows] == ORDER
    assert all(bar.outcome == states.SUCCESS and bar.end is not None
               for row in view.timeline.rows for bar in row.bars)
    fd = timed_store.stored(flow_uuid)
    started = {ad.name: ad.times[states.RUNNING] for ad in fd}
    assert {row.name: row.bars[0].start for row in view.timeline.rows} == started
