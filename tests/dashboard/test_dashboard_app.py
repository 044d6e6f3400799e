"""The web layer through Starlette's TestClient: pages, fragments, CSRF, read-only, token."""

from __future__ import annotations

import base64
import re
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator

import dashboard_flows as df
import pytest
from click.testing import CliRunner
from dashboard_store import FACTORIES, PASSWORD, store_run

from flowengine.cli.main import cli
from flowengine.dashboard import DashboardData, EventHub, create_app
from flowengine.persistence import base

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's note about httpx's successor
    from starlette.testclient import TestClient

TOKEN = "tok-" + "s3cr3t" * 4


def client(store: base.Backend, **options: object) -> TestClient:
    return TestClient(create_app(DashboardData(store, EventHub(None)), **options),  # type: ignore[arg-type]
                      follow_redirects=False)


@pytest.fixture
def app(store: base.Backend, stored: dict[str, str]) -> Iterator[TestClient]:
    with client(store) as found:
        yield found


def csrf_of(app: TestClient) -> str:
    """The CSRF token the pages gave (forms carry the same)."""
    app.get("/flows")
    return str(app.cookies["flowengine_csrf"])


def test_every_page_renders_without_secrets(app: TestClient, stored: dict[str, str]) -> None:
    pages = ["/flows", "/flows?state=REVERTED", "/workers", "/dead-letters",
             *(f"/flows/{uuid}" for uuid in stored.values())]
    for path in pages:
        response = app.get(path)
        assert response.status_code == 200, (path, response.text[:300])
        assert PASSWORD not in response.text, path
    assert app.get("/").headers["location"] == "/flows"


def test_flows_page_filters_and_paginates(app: TestClient, stored: dict[str, str]) -> None:
    page = app.get("/flows?state=SUCCESS").text
    assert stored["provisioning"] in page and stored["exploding"] not in page
    assert stored["exploding"] in app.get("/flows?name=explod").text
    assert "no flows match" in app.get(f"/flows?uuid={stored['exploding']}x").text
    bad = app.get("/flows?state=NOPE")
    assert bad.status_code == 400 and "NOPE" in bad.text
    assert app.get("/flows?since=yesterday").status_code == 400


def test_pager_links_seek_by_cursor(app: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowengine.dashboard import application

    monkeypatch.setattr(application, "PAGE_SIZE", 1)

    def link(page: str, rel: str) -> str:
        found = re.search(rf'<a rel="{rel}" href="([^"]+)"', page)
        assert found is not None, rel
        return "/flows" + found.group(1).replace("&amp;", "&")

    def uuids(page: str) -> list[str]:
        return re.findall(r'class="uuid" href="/flows/([^"]+)"', page)

    first = app.get("/flows").text
    older = link(first, "next")
    assert "page=2" in older and "after=" in older
    second = app.get(older).text
    assert "page 2 of" in second and uuids(second) != uuids(first)
    assert uuids(second) == uuids(app.get("/flows?page=2").text)  # as the offset finds it
    newer = link(second, "prev")
    assert "before=" in newer and uuids(app.get(newer).text) == uuids(first)
    bad = app.get("/flows?page=2&after=nonsense")
    assert bad.status_code == 400 and "cursor 'nonsense'" in bad.text


def test_flow_page_draws_atoms_coloured_by_state(app: TestClient,
                                                 stored: dict[str, str]) -> None:
    page = app.get(f"/flows/{stored['exploding']}").text
    assert '<svg id="graph"' in page
    assert re.search(r'data-atom="explode" data-state="REVERTED"', page)
    assert "RuntimeError" in page and "cannot reach the API with ***" in page
    fragment = app.get(f"/flows/{stored['exploding']}?fragment=1").text
    assert "<nav>" not in fragment and 'data-atom="connect"' in fragment
    assert app.get("/flows/not-a-flow").status_code == 404


def test_actions_need_the_csrf_token(app: TestClient, stored: dict[str, str]) -> None:
    token = csrf_of(app)
    path = f"/flows/{stored['exploding']}/suspend"
    assert app.post(path, data={}).status_code == 403
    assert app.post(path, data={"csrf_token": "forged" * 8}).status_code == 403
    assert app.post(path, data={"csrf_token": token},
                    headers={"origin": "http://evil.example"}).status_code == 403
    done = app.post(path, data={"csrf_token": token})
    assert done.status_code == 303 and "not+running+anywhere" in done.headers["location"]


def test_read_only_hides_and_refuses_actions(store: base.Backend,
                                             stored: dict[str, str]) -> None:
    with client(store, read_only=True) as app:
        page = app.get(f"/flows/{stored['exploding']}").text
        assert "read-only" in page and "<form method=\"post\"" not in page
        token = csrf_of(app)
        refused = app.post(f"/flows/{stored['exploding']}/resume", data={"csrf_token": token})
        assert refused.status_code == 403 and "read-only" in refused.text
        assert app.post("/dead-letters/x/requeue").status_code == 403


def test_a_token_protected_dashboard_refuses_strangers(store: base.Backend,
                                                       stored: dict[str, str]) -> None:
    with client(store, token=TOKEN) as app:
        assert app.get("/flows").status_code == 401
        assert app.get("/flows", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert app.post(f"/flows/{stored['exploding']}/resume").status_code == 401
        assert app.get("/flows", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        basic = base64.b64encode(f"ops:{TOKEN}".encode()).decode()
        assert app.get("/flows", headers={"authorization": f"Basic {basic}"}).status_code == 200
        entered = app.get(f"/flows?token={TOKEN}&state=SUCCESS")
        assert entered.status_code == 303 and entered.headers["location"] == "/flows?state=SUCCESS"
        assert TOKEN not in entered.headers["set-cookie"]
        assert app.get("/flows").status_code == 200  # the cookie now stands for the token


def test_the_command_refuses_an_open_address_without_a_token(store: base.Backend) -> None:
    result = CliRunner().invoke(cli, ["dashboard", "--backend", "sqlite:///x.db",
                                      "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--token" in result.output


def test_a_broker_that_is_away_is_named_without_its_password(store: base.Backend) -> None:
    broker = {"exchange": "x", "url": "redis://:s3cretpw@127.0.0.1:1/0"}
    with TestClient(create_app(DashboardData(store, EventHub(None), broker))) as app:
        page = app.get("/dead-letters")
    assert page.status_code == 200 and "cannot read the dead letters" in page.text
    assert "s3cretpw" not in page.text


def test_values_under_secret_looking_keys_never_show(store: base.Backend) -> None:
    # doc/dashboard.rst: "values under keys that look secret (password, token, secret,
    # api_key...) ... are shown as ***", even when nothing marked them secret.
    flow = store_run(store, df.credentials)
    with client(store) as app:
        for path in (f"/flows/{flow}", f"/flows/{flow}?fragment=1"):
            page = app.get(path).text
            for value in (df.API_KEY, df.DB_PASSWORD, PASSWORD):
                assert value not in page, (path, value)
            assert "db1" in page and "ada" in page, "values under other keys are shown"
            assert "***" in page
    view = DashboardData(store, EventHub(None)).flow(flow)
    assert view is not None
    [issued] = view.atoms
    assert issued["result"] == {"user": "ada", "api_key": "***",
                                "db": {"host": "db1", "password": "***"}}
    assert view.store["password"] == "***", "a store value under a secret-looking key"


def test_stored_text_is_escaped(store: base.Backend) -> None:
    import contextlib

    from flowengine.persistence import models

    book = models.LogBook("<b>book</b>")
    book.add(models.FlowDetail("<script>alert(1)</script>", "evil-flow"))
    with contextlib.closing(store.get_connection()) as conn:
        conn.save_logbook(book)
    with client(store) as app:
        for path in ("/flows", "/flows/evil-flow"):
            page = app.get(path).text
            assert "<script>alert(1)</script>" not in page
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_other_host_names_are_refused_when_asked(store: base.Backend) -> None:
    app = create_app(DashboardData(store, EventHub(None)), allowed_hosts=["127.0.0.1"])
    with TestClient(app, base_url="http://127.0.0.1:8080") as local:
        assert local.get("/flows").status_code == 200
        assert local.get("/flows", headers={"host": "rebound.example:8080"}).status_code == 400


def test_a_retry_waiting_out_its_delay_shows_when_it_is_due(store: base.Backend) -> None:
    import dashboard_flows as df

    from flowengine import engines, states
    from flowengine.cli import formatting as fmt
    from flowengine.engines.actions import META_RETRY_DUE

    engine = engines.load_from_factory(df.retried, store={"session": {"user": "ada"}},
                                       backend=store)
    engine.compile()
    engine.prepare()
    # As stored by an engine suspended (or stopped) while "again" waits before attempt 2.
    engine.storage.set_atom_state("again", states.RETRYING)
    engine.storage.update_atom_metadata("again", {META_RETRY_DUE: 1_800_000_000.0})
    engine.storage.set_flow_state(states.SUSPENDED)
    with client(store) as app:
        page = app.get(f"/flows/{engine.storage.flow_uuid}").text
    due = fmt.timestamp(1_800_000_000.0)
    assert f'data-delayed-until="{due}">delayed until {due}</span>' in page
    assert page.count("delayed until") == 1  # only the waiting controller


def test_resume_through_the_page(store: base.Backend) -> None:
    import dashboard_flows as df

    from flowengine import engines, states

    engine = engines.load_from_factory(df.plain, store={"session": {"user": "ada"}},
                                       backend=store)
    engine.compile()
    engine.prepare()
    engine.storage.set_flow_state(states.SUSPENDED)
    flow = str(engine.storage.flow_uuid)
    data = DashboardData(store, EventHub(None), factories=FACTORIES)
    with TestClient(create_app(data), follow_redirects=False) as app:
        page = app.get(f"/flows/{flow}").text
        assert f'action="/flows/{flow}/resume"' in page
        done = app.post(f"/flows/{flow}/resume", data={"csrf_token": csrf_of(app)})
        assert done.status_code == 303 and "resuming" in done.headers["location"]
        assert data.wait_idle(30.0)
        page = app.get(f"/flows/{flow}").text
    assert 'id="flow-state" data-state="SUCCESS"' in page and "/resume" not in page


def test_a_flow_with_secret_inputs_is_not_resumed_from_a_page(store: base.Backend) -> None:
    # Its secrets were never stored, and a page cannot be trusted to take them.
    import dashboard_flows as df

    from flowengine import engines, states

    engine = engines.load_from_factory(df.provisioning, store={"user": "ada", "password": "x"},
                                       backend=store)
    engine.compile()
    engine.prepare()
    engine.storage.set_flow_state(states.SUSPENDED)
    flow = str(engine.storage.flow_uuid)
    with TestClient(create_app(DashboardData(store, EventHub(None))),
                    follow_redirects=False) as app:
        done = app.post(f"/flows/{flow}/resume", data={"csrf_token": csrf_of(app)})
    notice = urllib.parse.unquote_plus(done.headers["location"])
    assert "refused" in notice and "'password'" in notice and "--store password=VALUE" in notice


def test_the_dead_letters_page_shows_expiry_and_removed_secrets(store: base.Backend) -> None:
    from flowengine.worker_based import dead_letters, protocol
    from flowengine.worker_based import secret_arguments as sa
    from flowengine.worker_based.broker import proxy

    broker = {"exchange": f"dash-{uuid.uuid4().hex[:8]}", "transport": "memory"}
    parker = proxy.Proxy("parker", broker["exchange"], transport="memory")
    try:
        request = protocol.Request(df.Provision("resize"), uuid.uuid4().hex, protocol.EXECUTE,
                                   {"session": "s3cret-session"})
        dead_letters.park(parker, request, {protocol.HEADER_REQUEST_ID: request.request_id,
                                            sa.HEADER_SECRET_ARGS: ["session"]},
                          "lost", "nobody-serves", ["w1"], reply_to="gone", ttl=3600)
        with TestClient(create_app(DashboardData(store, EventHub(None), broker))) as app:
            page = app.get("/dead-letters")
    finally:
        parker.close()
    assert page.status_code == 200 and "Expires (UTC)" in page.text
    assert "secret arguments removed: session" in page.text
    assert "s3cret-session" not in page.text


def _suspended_plain(store: base.Backend) -> str:
    """A stored ``plain`` flow, SUSPENDED after its first atom (it runs nowhere)."""
    from flowengine import engines, states

    engine = engines.load_from_factory(df.plain, store={"session": {"user": "ada"}},
                                       backend=store)
    for _state in engine.run_iter():
        if engine.storage.get_atom_state("disk") == states.SUCCESS:
            engine.suspend()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    return str(engine.storage.flow_uuid)


def test_cancel_through_the_page_reverts_a_flow_running_nowhere(store: base.Backend) -> None:
    flow = _suspended_plain(store)
    # It runs the flow's reverts itself, so it must be allowed the flow's factory module.
    data = DashboardData(store, EventHub(None), factories=FACTORIES)
    with TestClient(create_app(data), follow_redirects=False) as app:
        page = app.get(f"/flows/{flow}").text
        assert f'action="/flows/{flow}/cancel"' in page and 'id="cancel"' in page
        token = csrf_of(app)
        refused = app.post(f"/flows/{flow}/cancel", data={"csrf_token": token, "reason": " "})
        assert "refused%3A+a+cancel+needs+a+reason" in refused.headers["location"]
        done = app.post(f"/flows/{flow}/cancel",
                        data={"csrf_token": token, "reason": "order withdrawn"})
        assert done.status_code == 303 and "cancelling+flow" in done.headers["location"]
        assert data.wait_idle(30.0)
        page = app.get(f"/flows/{flow}").text
    assert 'id="flow-state" data-state="REVERTED"' in page
    assert "by dashboard at" in page and "order withdrawn" in page
    assert 'id="cancel"' not in page


def test_a_repair_of_a_flow_an_engine_holds_is_refused_by_the_page(
        store: base.Backend) -> None:
    import contextlib

    from flowengine.engines import suspend_requests as sr

    flow = _suspended_plain(store)
    with contextlib.closing(store.get_connection()) as conn:
        conn.change_flow_meta(flow, lambda fd: fd.meta.update(
            {sr.META_RUNNING_ON: sr.running_on("SerialActionEngine")}))
    with client(store) as app:
        done = app.post(f"/flows/{flow}/repair", data={
            "csrf_token": csrf_of(app), "action": "mark-reverted", "atom": "disk",
            "reason": "deleted"})
    location = urllib.parse.unquote_plus(done.headers["location"])
    assert "refused: flow 'plain'" in location and "is held by its SerialActionEngine" in location
