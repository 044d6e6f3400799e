"""Every engine records when each flow and atom state change happened, with no listener.

A flow run from service code (``engines.run`` with a backend, no ``flowengine run``, no
timing listener) shows when each atom started and how long it took in ``flowengine show``, in
the order the atoms ran, and on the dashboard's timeline without the page having been open
during the run; its "updated" time is the same in ``flows``, ``show`` and the dashboard.
"""

from __future__ import annotations

import contextlib
import datetime
import pathlib
import re

import pytest
from click.testing import CliRunner

from flowengine import engines, states, task
from flowengine.cli.main import cli
from flowengine.dashboard import DashboardData, EventHub
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models, queries


class Step(task.Task):
    def execute(self) -> str:
        return self.name


class Fails(task.Task):
    def execute(self) -> None:
        raise RuntimeError("no")


#: Run order differs from the names' order, and from the order the atoms were added in none.
ORDER = ["zeta", "alpha", "mid"]


def _run(url: str, engine: str, fail: bool = False) -> str:
    flow = linear_flow.Flow("timed").add(*(Step(name) for name in ORDER))
    if fail:
        flow.add(Fails("boom"))
    loaded = engines.load(flow, backend=url, book=models.LogBook("timings"), engine=engine)
    try:
        loaded.run()
    except RuntimeError:
        assert fail
    return str(loaded.storage.flow_uuid)


@pytest.mark.parametrize("engine", ["serial", "parallel"])
def test_show_tells_when_each_atom_of_a_service_run_flow_started_and_took(
        tmp_path: pathlib.Path, engine: str) -> None:
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    flow_uuid = _run(url, engine)
    shown = CliRunner().invoke(cli, ["show", flow_uuid, "--backend", url])
    assert shown.exit_code == 0, shown.output
    table = shown.output.split("\n\n")[1].splitlines()
    assert table[0].split()[:8] == ["ATOM", "KIND", "STATE", "INTENTION", "PROGRESS",
                                    "STARTED", "DURATION", "REVERT"]
    rows = [line.split() for line in table[1:]]
    assert [row[0] for row in rows] == ORDER  # the order they ran in
    for row in rows:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?", row[5]), row
        assert row[6] != "-", row


def test_a_reverted_flow_records_its_reverts_and_flow_states(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    flow_uuid = _run(url, "serial", fail=True)
    fd = _stored(url, flow_uuid)
    assert {f"{state}-timestamp" for state in (states.RUNNING, states.REVERTED)} <= set(fd.meta)
    zeta = next(ad for ad in fd if ad.name == "zeta")
    stamps = {key: value for key, value in zeta.meta.items() if key.endswith("-timestamp")}
    assert (stamps["RUNNING-timestamp"] <= stamps["SUCCESS-timestamp"]
            <= stamps["REVERTING-timestamp"] <= stamps["REVERTED-timestamp"])


def test_updated_is_one_time_in_flows_show_and_the_dashboard(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    flow_uuid = _run(url, "serial")
    listed = CliRunner().invoke(cli, ["flows", "--json", "--backend", url])
    [flow] = [row for row in _json_lines(listed.output) if row["uuid"] == flow_uuid]
    shown = CliRunner().invoke(cli, ["show", flow_uuid, "--json", "--backend", url])
    import json

    show_updated = json.loads(shown.output)["flow"]["updated_at"]
    with backends.backend(url) as backend:
        data = DashboardData(backend, EventHub(None))
        view = data.flow(flow_uuid)
        assert view is not None
        page = data.flows(queries.FlowQuery())
        [row] = [row for row in page.rows if row.uuid == flow_uuid]
    fd = _stored(url, flow_uuid)
    ended = datetime.datetime.fromtimestamp(fd.meta["SUCCESS-timestamp"], datetime.UTC)
    assert flow["updated_at"] == show_updated == view.summary["updated_at"]
    assert flow["updated_at"].startswith(ended.strftime("%Y-%m-%dT%H:%M:%S"))
    # The dashboard's list pages through the stored record's own update time, written with
    # the flow's last state change.
    assert abs(row.updated_at.replace(tzinfo=datetime.UTC) - ended) < datetime.timedelta(
        seconds=1)


def test_the_dashboard_timeline_comes_from_what_was_stored(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    flow_uuid = _run(url, "parallel")
    with backends.backend(url) as backend:
        view = DashboardData(backend, EventHub(None)).flow(flow_uuid)  # no event was heard
    assert view is not None and view.timeline is not None
    assert [row.name for row in view.timeline.rows] == ORDER
    assert all(bar.outcome == states.SUCCESS and bar.end is not None
               for row in view.timeline.rows for bar in row.bars)


def _stored(url: str, flow_uuid: str) -> models.FlowDetail:
    with backends.backend(url) as backend, contextlib.closing(backend.get_connection()) as conn:
        return conn.get_flow_details(flow_uuid)


def _json_lines(text: str) -> list[dict[str, object]]:
    import json

    stripped = text.strip()
    if stripped.startswith("["):
        return list(json.loads(stripped))
    return [json.loads(line) for line in stripped.splitlines() if line.startswith("{")]
