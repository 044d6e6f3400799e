"""The data interface: flows with secrets masked, graph and timeline, actions, dead letters."""

from __future__ import annotations

import uuid
from typing import Any

import dashboard_flows as df
import pytest
from dashboard_store import FACTORIES, PASSWORD, store_suspended

from flowengine import states
from flowengine.dashboard import ActionRefused, DashboardData, EventHub
from flowengine.dashboard.interface import ENGINE_META
from flowengine.persistence import base
from flowengine.worker_based import dead_letters, protocol
from flowengine.worker_based.broker import proxy


def test_a_flow_shows_graph_timeline_inputs_and_results_without_its_secret(
        store: base.Backend, stored: dict[str, str]) -> None:
    data = DashboardData(store, EventHub(None), factories=FACTORIES)
    view = data.flow(stored["provisioning"])
    assert view is not None
    assert view.summary["state"] == states.SUCCESS and view.graph_note is None
    links = {(link.source, link.target) for link in view.drawing.links}
    assert {("connect", "disk"), ("connect", "network"), ("disk", "report")} <= links
    columns = {node.name: node.x for node in view.drawing.nodes}
    assert columns["connect"] < columns["disk"] == columns["network"] < columns["report"]
    atoms = {atom["name"]: atom for atom in view.atoms}
    assert atoms["connect"]["inputs"] == {"user": "ada", "password": "***"}
    assert atoms["disk"]["inputs"] == {"session": {"user": "ada", "session": "s-1"}}
    assert atoms["report"]["result"] == "report for ada"
    assert view.timeline is not None
    assert {row.name for row in view.timeline.rows} == set(atoms)
    assert all(bar.outcome == states.SUCCESS for row in view.timeline.rows for bar in row.bars)
    assert PASSWORD not in repr(view)


def test_a_failure_shows_its_traceback_masked(store: base.Backend,
                                               stored: dict[str, str]) -> None:
    view = DashboardData(store, EventHub(None)).flow(stored["exploding"])
    assert view is not None and view.summary["state"] == states.REVERTED
    failure = {atom["name"]: atom for atom in view.atoms}["explode"]["failure"]
    assert failure["type"] == "RuntimeError"
    assert "cannot reach the API with ***" in failure["message"]
    assert "Traceback" in failure["traceback"] or "raise RuntimeError" in failure["traceback"]
    assert PASSWORD not in repr(view)
    assert view.resumable is False


def _heard_row(store: base.Backend, flow: str,
               events: list[tuple[str, float, dict[str, Any]]]) -> Any:
    """The timeline row of atom "disk" of ``flow`` after the dashboard heard ``events``."""
    hub = EventHub(None)
    data = DashboardData(store, hub)
    atom = next(a["uuid"] for a in data.flow(flow).atoms if a["name"] == "disk")  # type: ignore[union-attr]
    for kind, stamp, extra in events:
        hub.publish({"type": kind, "timestamp": stamp, "flow_uuid": flow, "atom_uuid": atom,
                     "task_name": "disk", **extra})
    view = data.flow(flow)
    assert view is not None and view.timeline is not None
    [row] = [row for row in view.timeline.rows if row.name == "disk"]
    return row


def test_events_heard_make_one_bar_per_attempt(store: base.Backend,
                                               stored: dict[str, str]) -> None:
    row = _heard_row(store, stored["provisioning"], [
        ("task-sent", 10.0, {"worker": "w1", "attempt": 1}),
        ("task-lost", 11.0, {"worker": "w1", "attempt": 1}),
        ("task-sent", 11.5, {"worker": "w2", "attempt": 2}),
        ("task-started", 12.0, {"worker": "w2", "attempt": 2}),
        ("task-succeeded", 13.0, {"worker": "w2", "attempt": 2})])
    assert [(b.attempt, b.worker, b.outcome, b.queued, b.start, b.end) for b in row.bars] == [
        (1, "w1", "LOST", 10.0, 10.0, 11.0), (2, "w2", "SUCCESS", 11.5, 12.0, 13.0)]


def test_a_retry_wait_heard_is_a_wait_bar_before_the_attempt(store: base.Backend,
                                                              stored: dict[str, str]) -> None:
    row = _heard_row(store, stored["provisioning"], [
        ("task-delayed", 10.0, {"attempt": 2, "due": 70.0, "kind": "retry"}),
        ("task-delay-ended", 70.0, {"attempt": 2, "kind": "retry"}),
        ("task-started", 70.5, {"attempt": 2, "kind": "retry"}),
        ("task-succeeded", 71.0, {"attempt": 2, "kind": "retry"})])
    assert [(b.action, b.attempt, b.outcome, b.start, b.end) for b in row.bars] == [
        ("wait", 2, "WAITED", 10.0, 70.0), ("execute", 2, "SUCCESS", 70.5, 71.0)]
    assert row.bars[0].note == "until 1970-01-01T00:01:10.000Z"


def test_resume_runs_a_suspended_flow_on_its_stored_engine(store: base.Backend) -> None:
    # A flow with secret inputs is refused (its secrets are not stored): see test_dashboard_app.
    storage = store_suspended(store, df.plain, {"session": {"user": "ada"}})
    flow = str(storage.flow_uuid)
    storage.update_flow_metadata({ENGINE_META: {"engine": "parallel",
                                                "options": {"max_workers": 2}}})
    data = DashboardData(store, EventHub(None), factories=FACTORIES)
    assert data.flow(flow).resumable  # type: ignore[union-attr]
    assert "parallel" in data.resume(flow)
    assert data.wait_idle(30.0)
    assert data.flow(flow).summary["state"] == states.SUCCESS  # type: ignore[union-attr]
    with pytest.raises(ActionRefused, match="SUCCESS"):
        data.resume(flow)
    with pytest.raises(ActionRefused, match="is SUCCESS, not running anywhere"):
        data.suspend(flow)
    with pytest.raises(ActionRefused, match="no flow"):
        data.resume("nope")


def test_dead_letters_list_requeue_and_discard(store: base.Backend) -> None:
    broker = {"exchange": f"dash-{uuid.uuid4().hex[:8]}", "transport": "memory"}
    data = DashboardData(store, EventHub(None), broker)
    assert data.dead_letters() == []  # also declares the dead letters' queue
    parker = proxy.Proxy("parker", broker["exchange"], transport="memory")
    ids = []
    for name in ("a", "b"):
        request = protocol.Request(df.Provision(name), uuid.uuid4().hex, protocol.EXECUTE,
                                   {"session": {"password": "pw"}})
        dead_letters.park(parker, request, {protocol.HEADER_REQUEST_ID: request.request_id},
                          "lost twice", "nobody-serves", ["w1", "w2"], reply_to="gone")
        ids.append(request.request_id)
    listed = data.dead_letters()
    assert [(d["id"], d["task_name"], d["reason"], d["workers"]) for d in listed] == [
        (ids[0], "a", "lost twice", ["w1", "w2"]), (ids[1], "b", "lost twice", ["w1", "w2"])]
    assert "requeued a" in data.requeue(ids[0])
    assert ids[1] in data.discard(ids[1])
    assert data.dead_letters() == []
    [back] = parker.browse("nobody-serves")
    assert back.headers[protocol.HEADER_REQUEST_ID] == ids[0]
    with pytest.raises(ActionRefused, match="No dead letter"):
        data.discard(ids[1])
    parker.close()


def test_workers_are_live_then_gone(store: base.Backend) -> None:
    now = [100.0]
    hub = EventHub(None, clock=lambda: now[0])
    for worker in ("w1", "w2"):
        hub.publish({"type": "worker-heartbeat", "worker": worker, "topic": "t", "timestamp": 99.0,
                     "tasks": ["x.Y"], "capacity": 2, "free": 1, "in_flight": 1,
                     "hostname": "h", "pid": 1})
    hub.publish({"type": "worker-offline", "worker": "w2", "timestamp": 99.5})
    now[0] = 120.0
    rows = DashboardData(store, hub).workers()
    assert [(r["worker"], r["gone"], r["silent"]) for r in rows] == [
        ("w1", False, True), ("w2", True, False)]
