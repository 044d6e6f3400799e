"""Resuming from the dashboard on the options a flow ran on, never a masked secret; suspending."""

from __future__ import annotations

import contextlib
import uuid
import warnings
from typing import Any

import dashboard_flows as df
import pytest
from dashboard_store import FACTORIES, store_suspended

from flowengine import engines, states
from flowengine.cli import stored_run
from flowengine.dashboard import ActionRefused, DashboardData, EventHub, create_app
from flowengine.dashboard.resuming import OptionsMissing, engine_options
from flowengine.persistence import base, models

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's note about httpx's successor
    from starlette.testclient import TestClient

SECRET = "pa55-" + "w0rd" * 3
BROKER_URL = f"amqp://guest:{SECRET}@rabbit.example:5672//"


def ran_with(engine: str, broker: dict[str, Any] | None = None,
             topics: tuple[str, ...] = ()) -> models.FlowDetail:
    fd = models.FlowDetail("stored", "f-uuid")
    fd.meta[stored_run.META_KEY] = stored_run.record(engine, broker or {}, list(topics))
    return fd


def broker(url: str | None = BROKER_URL, **options: str) -> dict[str, Any]:
    return {"exchange": "ops", "url": url, "transport": None, "transport_options": options,
            "taskflow_compat": False}


def test_a_local_engine_resumes_on_its_stored_engine() -> None:
    assert engine_options(ran_with("parallel://?max_workers=2"), broker()) == (
        "parallel://?max_workers=2", {})


def test_the_masked_password_comes_from_the_dashboard_for_the_same_broker() -> None:
    fd = ran_with("worker-based", broker(region="eu", api_key=SECRET), ("red", "blue"))
    assert SECRET not in repr(fd.meta)
    own = broker(api_key=SECRET) | {"exchange": "dashboard-exchange"}
    name, options = engine_options(fd, own)
    assert name == "worker-based"
    assert options == {"exchange": "ops", "url": BROKER_URL, "transport": None,
                       "transport_options": {"region": "eu", "api_key": SECRET},
                       "taskflow_compat": False, "topics": ["red", "blue"]}


def test_a_broker_without_a_password_needs_nothing_from_the_dashboard() -> None:
    fd = ran_with("worker-based", broker("redis://cache:6379/0"), ("red",))
    name, options = engine_options(fd, None)
    assert (name, options["url"], options["topics"]) == (
        "worker-based", "redis://cache:6379/0", ["red"])


@pytest.mark.parametrize(("own", "named"), [
    (None, "this dashboard has no broker options"),
    (broker(f"amqp://guest:{SECRET}@other.example:5672//"),
     "amqp://guest:***@other.example:5672//"),
])
def test_a_masked_password_from_another_broker_is_refused(own: dict[str, Any] | None,
                                                          named: str) -> None:
    with pytest.raises(OptionsMissing) as refused:
        engine_options(ran_with("worker-based", broker()), own)
    message = str(refused.value)
    assert "amqp://guest:***@rabbit.example:5672//" in message and named in message
    assert "--url" in message and SECRET not in message


def test_a_secret_transport_option_the_dashboard_lacks_is_refused() -> None:
    fd = ran_with("worker-based", broker("redis://cache:6379/0", token=SECRET))
    with pytest.raises(OptionsMissing, match="secret transport option.s. token.*"
                                             "--transport-option"):
        engine_options(fd, broker("redis://cache:6379/0"))


def test_a_masked_engine_uri_is_refused() -> None:
    with pytest.raises(OptionsMissing, match=r"--engine"):
        engine_options(ran_with(f"parallel://ada:{SECRET}@x/"), None)


def test_the_dashboard_resumes_a_run_record_and_refuses_a_missing_password(
        store: base.Backend) -> None:
    storage = store_suspended(store, df.plain, {"session": {"user": "ada"}})
    flow = str(storage.flow_uuid)
    # The legacy meta key is overridden by run's record.
    storage.update_flow_metadata({
        "engine": {"engine": "serial"},
        stored_run.META_KEY: stored_run.record("worker-based", broker(), ["red"])})
    data = DashboardData(store, EventHub(None), factories=FACTORIES)
    with pytest.raises(ActionRefused, match="whose password is not stored") as refused:
        data.resume(flow)
    assert SECRET not in str(refused.value)
    storage.update_flow_metadata({
        stored_run.META_KEY: stored_run.record("parallel", {}, [])})
    assert "on the parallel engine" in data.resume(flow)
    assert data.wait_idle(30.0)
    assert data.flow(flow).summary["state"] == states.SUCCESS  # type: ignore[union-attr]


def test_engines_load_records_a_worker_based_flow_for_the_dashboard(store: base.Backend) -> None:
    exchange = f"dash-{uuid.uuid4().hex[:8]}"
    engine = engines.load_from_factory(
        df.plain, store={"session": {"user": "ada"}}, book=models.LogBook("loaded"),
        backend=store, engine="worker-based", exchange=exchange, transport="memory",
        topics=["red"], transport_options={"api_token": SECRET, "polling_interval": 0.1})
    engine.storage.set_flow_state(states.SUSPENDED)  # saves the flow detail, as a run does
    with contextlib.closing(store.get_connection()) as conn:
        fd = conn.get_flow_details(str(engine.storage.flow_uuid))
    assert SECRET not in repr(fd.meta)
    own = {"exchange": "elsewhere", "url": None, "transport": "memory",
           "transport_options": {"api_token": SECRET}}
    name, options = engine_options(fd, own)
    assert (name, options["exchange"], options["topics"], options["transport_options"]) == (
        "worker-based", exchange, ["red"], {"api_token": SECRET, "polling_interval": 0.1})
    with pytest.raises(OptionsMissing, match="api_token"):
        engine_options(fd, {**own, "transport_options": {}})


def test_a_flow_running_elsewhere_is_asked_through_the_store(store: base.Backend) -> None:
    storage = store_suspended(store, df.plain, {"session": {"user": "ada"}})
    storage.set_flow_state(states.RUNNING)
    flow = str(storage.flow_uuid)
    data = DashboardData(store, EventHub(None))
    with TestClient(create_app(data)) as app:  # type: ignore[arg-type]
        page = app.get(f"/flows/{flow}").text
        assert 'id="suspend"' in page and 'id="suspend-requested"' not in page
        assert "suspend requested for flow" in data.suspend(flow)
        page = app.get(f"/flows/{flow}").text
    # Acknowledged on the page until the engine answers; not asked twice.
    assert 'id="suspend-requested"' in page and 'id="suspend"' not in page
    assert "by dashboard at" in page
    assert "already requested" in data.suspend(flow)
