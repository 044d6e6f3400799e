"""``flowengine dead-letters requeue`` says what will happen, from the flow's stored state.

Flows are run and saved by ``flowengine run --backend`` (SQLite); their requests are parked on
kombu's in-process memory broker as an engine parks them (``dead_letters.park``), naming the
flow in their headers.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import uuid
from collections.abc import Iterator

import cli_flows  # tests/unit is on sys.path (pytest rootdir insertion)
import pytest
from click.testing import CliRunner, Result

from flowengine.cli import exits
from flowengine.cli.main import cli
from flowengine.dashboard.interface import ActionRefused, DashboardData
from flowengine.dashboard.live import EventHub
from flowengine.persistence import backends
from flowengine.worker_based import dead_letters
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import secret_arguments as sa
from flowengine.worker_based.broker import proxy as px

TOPIC = "parked-topic"


def invoke(*args: str) -> Result:
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("FLOWENGINE_")}
    return CliRunner().invoke(cli, list(args), env=clean, catch_exceptions=False)


class Setting:
    """A SQLite backend with saved flows, and an exchange on the memory broker."""

    def __init__(self, tmp_path: pathlib.Path) -> None:
        self.uri = f"sqlite:///{tmp_path / 'flows.db'}"
        self.exchange = f"requeue-{uuid.uuid4().hex[:8]}"
        self.parker = px.Proxy("parker", self.exchange, transport="memory")

    def broker(self) -> list[str]:
        return ["--transport", "memory", "--exchange", self.exchange]

    def run(self, factory: str, expected: int) -> str:
        """Run ``cli_flows:factory`` saved in the backend; its flow uuid."""
        result = invoke("run", f"cli_flows:{factory}", "--backend", self.uri, "--json")
        assert result.exit_code == expected, result.output
        flow_uuid = json.loads(result.stdout.splitlines()[-1])["uuid"]
        cli_flows.JOURNAL.clear()
        return str(flow_uuid)

    def park(self, flow_uuid: str, task_name: str = "last",
             arguments: dict[str, object] | None = None, secret: list[str] | None = None) -> str:
        request = pr.Request(cli_flows.Echo(task_name), uuid.uuid4().hex, pr.EXECUTE,
                             arguments or {})
        headers: dict[str, object] = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION,
                                      pr.HEADER_REQUEST_ID: request.request_id,
                                      pr.HEADER_FLOW_UUID: flow_uuid}
        if secret:
            headers[sa.HEADER_SECRET_ARGS] = secret
        dead_letters.park(self.parker, request, headers, "lost", TOPIC, ["w1"], reply_to="gone")
        return request.request_id

    def requeue(self, letter_id: str, *extra: str) -> Result:
        return invoke("dead-letters", "requeue", letter_id, *self.broker(), *extra)

    def listed(self) -> list[str]:
        result = invoke("dead-letters", "list", "--json", *self.broker())
        assert result.exit_code == 0, result.output
        return [json.loads(line)["id"] for line in result.stdout.splitlines()]

    def sent_to_topic(self) -> list[str]:
        return [str(m.headers.get(pr.HEADER_REQUEST_ID)) for m in self.parker.browse(TOPIC)]


@pytest.fixture
def setting(tmp_path: pathlib.Path) -> Iterator[Setting]:
    cli_flows.JOURNAL.clear()
    made = Setting(tmp_path)
    try:
        yield made
    finally:
        made.parker.close()
        cli_flows.JOURNAL.clear()


def test_a_finished_flow_is_refused_unless_forced(setting: Setting) -> None:
    flow = setting.run("make_reverted", exits.REVERTED)
    letter = setting.park(flow)
    refused = setting.requeue(letter, "--backend", setting.uri)
    assert refused.exit_code == exits.ERROR, refused.output
    assert f"Refused: its flow 'reverted' ({flow}) is REVERTED: it has finished" in refused.stderr
    assert "--force re-sends it anyway" in refused.stderr
    assert setting.listed() == [letter] and setting.sent_to_topic() == []
    forced = setting.requeue(letter, "--backend", setting.uri, "--force")
    assert forced.exit_code == exits.OK, forced.output
    assert "is REVERTED, but --force: re-sending task 'last'" in forced.stdout
    assert setting.listed() == [] and setting.sent_to_topic() == [letter]


def test_without_a_backend_it_is_refused_unless_forced(setting: Setting) -> None:
    flow = setting.run("make_reverted", exits.REVERTED)  # the state it cannot see
    letter = setting.park(flow)
    refused = setting.requeue(letter)
    assert refused.exit_code == exits.ERROR, refused.output
    [line] = refused.stderr.strip().splitlines()
    assert "cannot be known without the persistence backend" in line
    assert "give --backend URL" in line and "--force" in line
    assert setting.listed() == [letter] and setting.sent_to_topic() == []
    other = setting.uri.replace("flows.db", "other.db")
    with contextlib.closing(backends.fetch(other)) as store, \
            contextlib.closing(store.get_connection()) as conn:
        conn.upgrade()  # a store, but not the one the flow is in
    elsewhere = setting.requeue(letter, "--backend", other)
    assert elsewhere.exit_code == exits.ERROR and "is not in that backend" in elsewhere.stderr
    sent = setting.requeue(letter, "--force")
    assert sent.exit_code == exits.OK, sent.output
    assert "nothing will record the outcome" in sent.stdout
    assert setting.sent_to_topic() == [letter]


def test_resume_reruns_the_atom_inside_its_unfinished_flow(setting: Setting) -> None:
    flow = setting.run("make_suspending", exits.SUSPENDED)
    letter = setting.park(flow, arguments={"token": "t0ken"}, secret=["token"])
    # Its secret argument was removed at parking: it cannot go out as it is.
    raw = setting.requeue(letter, "--backend", setting.uri)
    assert raw.exit_code == exits.ERROR
    assert "secret argument(s) 'token' were removed" in raw.stderr
    resumed = setting.requeue(letter, "--backend", setting.uri, "--resume")
    assert resumed.exit_code == exits.OK, resumed.output
    assert f"Its flow 'suspending' ({flow}) is SUSPENDED: resuming it" in resumed.stdout
    assert f"flow suspending ({flow}): SUCCESS" in resumed.stdout
    assert cli_flows.JOURNAL == ["execute last"]
    assert setting.listed() == [] and setting.sent_to_topic() == []
    # Now finished: nothing to resume.
    other = setting.park(flow)
    again = setting.requeue(other, "--backend", setting.uri, "--resume")
    assert again.exit_code == exits.ERROR
    assert "is SUCCESS: it has finished, so there is nothing to resume" in again.stderr


def test_an_unfinished_flow_is_requeued_saying_its_outcome_is_not_recorded(
        setting: Setting) -> None:
    flow = setting.run("make_suspending", exits.SUSPENDED)
    letter = setting.park(flow)
    sent = setting.requeue(letter, "--backend", setting.uri)
    assert sent.exit_code == exits.OK, sent.output
    assert "is SUSPENDED: re-sending task 'last' (execute) as it was" in sent.stdout
    assert "--resume re-runs it inside the flow instead" in sent.stdout
    assert setting.sent_to_topic() == [letter]


def test_unknown_letters_and_contradictory_options(setting: Setting) -> None:
    missing = setting.requeue("nope")
    assert missing.exit_code == exits.USAGE and "No dead letter with id 'nope'" in missing.stderr
    both = setting.requeue("nope", "--force", "--resume")
    assert both.exit_code == exits.USAGE
    letter = setting.park(str(uuid.uuid4()))
    nowhere = setting.requeue(letter, "--backend", f"{setting.uri}-missing")
    assert nowhere.exit_code == exits.USAGE and "--backend" in nowhere.output
    assert setting.listed() == [letter]


def test_the_dashboard_applies_the_same_rule(setting: Setting) -> None:
    flow = setting.run("make_reverted", exits.REVERTED)
    letter = setting.park(flow)
    with contextlib.closing(backends.fetch(setting.uri)) as store:
        data = DashboardData(store, EventHub(None),
                             {"exchange": setting.exchange, "transport": "memory"})
        with pytest.raises(ActionRefused, match=r"is REVERTED: it has finished"):
            data.requeue(letter)
    assert setting.listed() == [letter] and setting.sent_to_topic() == []
