"""``flowengine run``: outcomes and exit codes, live and plain output, resuming, engines."""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import cli_flows  # tests/unit is on sys.path (pytest rootdir insertion)
import pytest
from click.testing import CliRunner, Result
from servers import require_module

from flowengine import engines
from flowengine.cli import exits
from flowengine.cli.main import cli
from flowengine.persistence import backends

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNIT = pathlib.Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def clean_journal() -> Iterator[None]:
    cli_flows.JOURNAL.clear()
    yield
    cli_flows.JOURNAL.clear()


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    # Environment variables of the developer's shell must not change what the tests see.
    clean = {key: None for key in os.environ if key.startswith("FLOWENGINE_")}
    clean.update({"TTY_INTERACTIVE": None, "FORCE_COLOR": None})
    clean.update(env or {})
    return CliRunner().invoke(cli, list(args), env=clean, catch_exceptions=False)


def lines(result: Result) -> list[str]:
    return [line.rstrip() for line in result.stdout.splitlines()]


def test_success_prints_each_change_then_a_summary() -> None:
    result = invoke("run", "cli_flows:make_ok", "--kwarg", "start=5")
    assert result.exit_code == exits.OK, result.output
    out = lines(result)
    assert out[0].startswith("flow ok (") and out[0].endswith(") on serial")
    changes = [line for line in out[1:] if line.startswith(("a:", "b:"))][:6]
    assert changes[0:2] == ["a: RUNNING", "a: 50%"]
    assert changes[2].startswith("a: SUCCESS in ") and changes[2].endswith("s -> 6")
    assert changes[5].startswith("b: SUCCESS in ") and changes[5].endswith("s -> 7")
    assert any(line.split()[:3] == ["b", "task", "SUCCESS"] for line in out)
    assert "SUCCESS after" in out[-1] and out[-1].endswith("(exit code 0)")
    assert cli_flows.JOURNAL == ["execute a", "execute b"]


def test_a_retry_wait_is_shown_with_its_due_time() -> None:
    result = invoke("run", "cli_flows:make_delayed")
    assert result.exit_code == exits.OK, result.output
    changes = [line for line in lines(result) if line.startswith(("again:", "flaky:"))]
    waiting = [line for line in changes if line.startswith("again: DELAYED")]
    assert len(waiting) == 1, changes
    assert re.fullmatch(r"again: DELAYED waits 0\.01s for attempt 2 \(until "
                        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\)", waiting[0]), waiting
    at = changes.index(waiting[0])
    # After the retry decision and its subflow's reset, before the controller runs again.
    assert changes[at - 2:at] == ["again: RETRYING", "flaky: PENDING"], changes
    assert changes[at + 1] == "again: RUNNING", changes


def test_reverted_flow_exits_3_with_revert_order_and_failure() -> None:
    result = invoke("run", "cli_flows:make_reverted")
    assert result.exit_code == exits.REVERTED, result.output
    out = lines(result)
    assert "b: FAILURE" in "\n".join(out) and "(RuntimeError: b cannot go on)" in result.stdout
    assert "revert order: b -> a" in out
    assert "failure: b (execute) RuntimeError: b cannot go on" in out
    assert "    Traceback (most recent call last):" in out
    assert cli_flows.JOURNAL == ["execute a", "execute b", "revert b", "revert a"]


def test_failed_revert_exits_4_and_shows_both_failures() -> None:
    result = invoke("run", "cli_flows:make_revert_fails")
    assert result.exit_code == exits.FAILED, result.output
    out = lines(result)
    assert any(line.startswith("a: REVERT_FAILURE in ") for line in out)
    assert "failure: b (execute) RuntimeError: b cannot go on" in out
    assert "failure: a (revert) ValueError: a cannot be undone" in out
    assert "revert order: b -> a (revert failed)" in out
    outcome = json.loads(invoke("run", "cli_flows:make_revert_fails", "--json").stdout)
    assert (outcome["reverted"], outcome["revert_failed"]) == (["b", "a"], ["a"])


def test_suspended_flow_exits_5_and_resumes_where_it_stopped(tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    first = invoke("run", "cli_flows:make_suspending", "--backend", uri)
    assert first.exit_code == exits.SUSPENDED, first.output
    assert "received SIGINT: suspending" in first.stderr
    assert cli_flows.JOURNAL == ["execute first", "execute interrupt"]
    hint = next(line for line in lines(first) if line.startswith("resume with: "))
    flow_id = hint.split()[5]
    assert hint == f"resume with: flowengine run --resume {flow_id} --backend {uri}"

    cli_flows.JOURNAL.clear()
    again = invoke("run", "--resume", flow_id[:8], "--backend", uri)
    assert again.exit_code == exits.OK, again.output
    assert cli_flows.JOURNAL == ["execute last"]
    assert f"flow suspending ({flow_id}): SUCCESS" in again.stdout


def test_suspending_without_a_backend_says_it_cannot_be_resumed() -> None:
    result = invoke("run", "cli_flows:make_suspending")
    assert result.exit_code == exits.SUSPENDED
    assert "not saved (no --backend): this run cannot be resumed" in lines(result)


def test_json_outcome() -> None:
    result = invoke("run", "cli_flows:make_reverted", "--json")
    assert result.exit_code == exits.REVERTED
    outcome = json.loads(result.stdout)
    assert outcome["state"] == "REVERTED" and outcome["exit_code"] == exits.REVERTED
    assert outcome["engine"] == "serial" and outcome["saved"] is False
    assert outcome["reverted"] == ["b", "a"]
    [failure] = outcome["failures"]
    assert failure["atom"] == "b" and failure["action"] == "execute"
    assert failure["type"] == "RuntimeError" and failure["message"] == "b cannot go on"
    assert "raise RuntimeError" in failure["traceback"]
    assert [(a["name"], a["state"]) for a in outcome["atoms"]] == [("a", "REVERTED"),
                                                                   ("b", "REVERTED")]
    assert outcome["atoms"][0]["result"] == 2


def test_store_values_and_factory_arguments() -> None:
    result = invoke("run", "cli_flows:make_needs_x", "--store", "x=41", "--json")
    assert result.exit_code == exits.OK, result.output
    assert json.loads(result.stdout)["atoms"][0]["result"] == 42

    result = invoke("run", "cli_flows:make_from_region", "--arg", "eu", "--kwarg", "size=3",
                    "--json")
    assert result.exit_code == exits.OK, result.output
    assert json.loads(result.stdout)["atoms"][0]["name"] == "eu-3"


def test_options_come_from_environment_variables() -> None:
    result = invoke("run", "cli_flows:make_needs_x",
                    env={"FLOWENGINE_ENGINE": "parallel://?max_workers=2",
                         "FLOWENGINE_STORE": "x=1", "FLOWENGINE_JSON": "1"})
    assert result.exit_code == exits.OK, result.output
    outcome = json.loads(result.stdout)
    assert outcome["engine"] == "parallel://?max_workers=2"
    assert outcome["atoms"][0]["result"] == 2


def test_missing_inputs_exit_1_naming_the_atom_and_the_input() -> None:
    result = invoke("run", "cli_flows:make_needs_x")
    assert result.exit_code == exits.ERROR
    assert result.stderr.splitlines() == [
        "Error: flow 'needs-x': MissingDependencies: it needs input(s) nothing in it provides: x",
        "  x: needed by atom 'a' (execute)",
        "hint: give them with --store NAME=VALUE (--store x=VALUE)"]


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module:make", "cannot import module 'no_such_module' (from "
                            "'no_such_module:make'): no module named 'no_such_module'"),
    ("cli_flows:nothing", "module 'cli_flows' has no attribute 'nothing'"),
    ("cli_flows:make_bad", "flow factory 'cli_flows:make_bad' returned 42 (int)"),
    ("cli_flows:make_raising", "flow factory 'cli_flows:make_raising' raised KeyError"),
    ("cli_flows:JOURNAL", "'cli_flows:JOURNAL' is a Journal, not a flow or a flow factory"),
])
def test_what_cannot_be_imported_or_built_exits_1(spec: str, message: str) -> None:
    result = invoke("run", spec)
    assert result.exit_code == exits.ERROR
    assert message in result.stderr


def test_arguments_for_a_flow_object_are_refused() -> None:
    result = invoke("run", "cli_flows:FLOW_OBJECT", "--arg", "1")
    assert result.exit_code == exits.ERROR
    assert "is a flow object, not a factory" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    ((), "give the flow to run as MODULE:FACTORY, or --resume FLOW_ID"),
    (("--resume", "abc"), "--resume needs --backend"),
    (("cli_flows",), "'cli_flows' is not of the form module:attribute"),
    (("cli_flows:make_ok", "--engine", "warp"), "Could not find engine 'warp'"),
    (("cli_flows:make_ok", "--store", "novalue"), "is not of the form key=value"),
    (("cli_flows:make_ok", "--backend", "nosuch://x"), "No persistence backend for scheme"),
])
def test_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    result = invoke("run", *args)
    assert result.exit_code == exits.USAGE
    assert message in result.stderr


def test_a_flow_that_cannot_run_saves_nothing(tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    result = invoke("run", "cli_flows:make_missing", "--backend", uri)
    assert result.exit_code == exits.ERROR
    assert "  nowhere: needed by atom 'b' (execute, revert)" in result.stderr.splitlines()
    assert invoke("flows", "--backend", uri).stdout == "no flows\n"


def test_an_unknown_engine_saves_nothing(tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    result = invoke("run", "cli_flows:make_ok", "--engine", "warp", "--backend", uri)
    assert result.exit_code == exits.USAGE
    assert invoke("flows", "--backend", uri).stdout == "no flows\n"


def test_resuming_an_unknown_flow_exits_2(tmp_path: pathlib.Path) -> None:
    result = invoke("run", "--resume", "0000", "--backend", f"sqlite:///{tmp_path / 'f.db'}")
    assert result.exit_code == exits.USAGE
    assert "Invalid value for --resume: no flow '0000'" in result.stderr


@pytest.mark.parametrize(("spec", "recorded", "atoms"), [
    ("cli_flows:make_ok", "cli_flows.make_ok", ["a", "b"]),
    ("cli_flows:FLOW_OBJECT", "flowengine.cli.loading.flow_from_spec", ["only"]),
    ("cli_flows:lambda_factory", "flowengine.cli.loading.flow_from_spec", ["lam"]),
])
def test_saved_flows_record_how_to_rebuild_them(tmp_path: pathlib.Path, spec: str,
                                                recorded: str, atoms: list[str]) -> None:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    result = invoke("run", spec, "--backend", uri, "--book", "nightly", "--json")
    assert result.exit_code == exits.OK, result.output
    uuid = json.loads(result.stdout)["uuid"]
    backend = backends.fetch(uri)
    try:
        conn = backend.get_connection()
        [book] = conn.get_logbooks()
        assert book.name == "nightly"
        detail = conn.get_flow_details(uuid)
        conn.close()
    finally:
        backend.close()
    assert detail.meta["factory"]["name"] == recorded
    assert [atom.name for atom in engines.flow_from_detail(detail)] == atoms


def test_live_table_when_interactive() -> None:
    result = invoke("run", "cli_flows:make_reverted", env={"TTY_INTERACTIVE": "1"})
    assert result.exit_code == exits.REVERTED
    assert "a: RUNNING" not in result.stdout  # no plain lines: a table instead
    table_rows = [line.split() for line in lines(result) if line.startswith(("a ", "b "))]
    assert [row[:3] for row in table_rows[-2:]] == [["a", "task", "REVERTED"],
                                                   ["b", "task", "REVERTED"]]
    assert "revert order: b -> a" in result.stdout


def test_plain_wins_over_an_interactive_console() -> None:
    result = invoke("run", "cli_flows:make_ok", "--plain", env={"TTY_INTERACTIVE": "1"})
    assert result.exit_code == exits.OK
    assert "a: RUNNING" in lines(result)


def test_worker_based_engine_runs_tasks_on_a_worker() -> None:
    from flowengine.worker_based.worker import Worker

    exchange, topic = "cli-run-test", "cli-tasks"
    worker = Worker(exchange=exchange, topic=topic, tasks=[cli_flows.Add, cli_flows.Fail],
                    transport="memory", threads_count=2)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert worker.wait(timeout=10), "the worker did not start"
        result = invoke("run", "cli_flows:make_reverted", "--engine", "worker-based",
                        "--transport", "memory", "--exchange", exchange, "--topic", topic)
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)
    assert result.exit_code == exits.REVERTED, result.output
    out = lines(result)
    assert out[0].endswith("on worker-based")
    assert "a: 50%" in out  # progress reported by the remote task
    assert "revert order: b -> a" in out
    assert cli_flows.JOURNAL == ["execute a", "execute b", "revert b", "revert a"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _samples(lines: list[str]) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines}


def test_metrics_endpoint_of_a_local_engine() -> None:
    require_module("prometheus_client")
    port = _free_port()
    result = invoke("run", "cli_flows:make_scraping", "--arg", str(port), "--metrics-port",
                    str(port), "--json")
    assert result.exit_code == exits.OK, result.output
    during = _samples(json.loads(result.stdout)["atoms"][1]["result"])
    assert during['flowengine_atoms_in_flight{role="engine"}'] >= 1  # the scraping task
    done = 'flowengine_atom_outcomes_total{role="engine",state="SUCCESS",task="before-scrape"}'
    assert during[done] >= 1
    # The endpoint outlives the run (in this process): the finished flow is counted.
    after = _samples(cli_flows.Scrape("again").execute(port))
    assert after[done] == during[done]
    scraped = 'flowengine_atom_outcomes_total{role="engine",state="SUCCESS",task="scrape"}'
    assert after[scraped] == during.get(scraped, 0.0) + 1


def test_metrics_port_that_cannot_be_served_exits_1() -> None:
    require_module("prometheus_client")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("run", "cli_flows:make_ok", "--metrics-port", str(port))
    assert result.exit_code == exits.ERROR
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert cli_flows.JOURNAL == []


def test_events_of_a_local_engine() -> None:
    from flowengine.worker_based.events import EventReceiver

    exchange = f"cli-events-{uuid.uuid4().hex[:8]}"
    receiver = EventReceiver(exchange, transport="memory")
    seen: list[dict[str, object]] = []
    listening, stop = threading.Event(), threading.Event()

    def read() -> None:
        for event in receiver.iter(ready=listening.set, stop=stop):
            seen.append(event)
            if event["type"] == "flow-reverted":
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert listening.wait(10)
    quiet = invoke("run", "cli_flows:make_reverted", "--transport", "memory", "--exchange",
                   exchange)
    loud = invoke("run", "cli_flows:make_reverted", "--events", "--transport", "memory",
                  "--exchange", exchange, "--json")
    reader.join(10)
    stop.set()
    assert (quiet.exit_code, loud.exit_code) == (exits.REVERTED, exits.REVERTED)
    flow_uuid = json.loads(loud.stdout)["uuid"]
    assert {e["flow_uuid"] for e in seen} == {flow_uuid}  # none from the run without --events
    assert [e["type"] for e in seen] == [
        "flow-started", "task-started", "task-progress", "task-succeeded", "task-started",
        "task-failed", "task-reverted", "task-reverted", "flow-reverted"]


def test_show_lists_every_attempt_of_a_remote_task(tmp_path: pathlib.Path) -> None:
    from flowengine.worker_based.worker import Worker

    exchange, topic = f"cli-attempts-{uuid.uuid4().hex[:8]}", "cli-tasks"
    worker = Worker(exchange=exchange, topic=topic, tasks=[cli_flows.Add, cli_flows.Fail],
                    transport="memory", threads_count=2, events=False)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    try:
        assert worker.wait(timeout=10), "the worker did not start"
        ran = invoke("run", "cli_flows:make_reverted", "--engine", "worker-based",
                     "--transport", "memory", "--exchange", exchange, "--topic", topic,
                     "--backend", uri, "--json")
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)
    assert ran.exit_code == exits.REVERTED, ran.output
    flow_id = json.loads(ran.stdout)["uuid"]
    shown = json.loads(invoke("show", flow_id, "--backend", uri, "--json").stdout)
    a, b = shown["atoms"]
    me = worker.worker_id
    assert a["attempt_log"] == [
        {"attempt": 1, "action": "execute", "worker": me, "outcome": "SUCCESS"},
        {"attempt": 1, "action": "revert", "worker": me, "outcome": "REVERTED"}]
    assert [(e["action"], e["outcome"]) for e in b["attempt_log"]] == [
        ("execute", "FAILURE"), ("revert", "REVERTED")]
    assert (a["workers"], a["attempts"]) == ([me], 1)
    text = lines(invoke("show", flow_id, "--backend", uri))
    table = text[text.index("attempts:") + 1:]
    assert [row.split() for row in table[:5]] == [
        ["ATOM", "ACTION", "ATTEMPT", "WORKER", "OUTCOME"],
        ["a", "execute", "1", me, "SUCCESS"], ["a", "revert", "1", me, "REVERTED"],
        ["b", "execute", "1", me, "FAILURE"], ["b", "revert", "1", me, "REVERTED"]]


def test_console_script_runs_and_checks_flows(tmp_path: pathlib.Path) -> None:
    script = pathlib.Path(sys.executable).parent / "flowengine"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWENGINE_")}

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), *args], cwd=UNIT, env=env, capture_output=True,
                              text=True, timeout=120)

    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    ran = call("run", "cli_flows:make_reverted", "--backend", uri)
    assert ran.returncode == exits.REVERTED, ran.stdout + ran.stderr
    assert "revert order: b -> a" in ran.stdout.splitlines()
    suspended = call("run", "cli_flows:make_suspending", "--backend", uri, "--json")
    assert suspended.returncode == exits.SUSPENDED, suspended.stdout + suspended.stderr
    assert json.loads(suspended.stdout)["state"] == "SUSPENDED"
    checked = call("check", "cli_flows:make_nested")
    assert checked.returncode == exits.OK, checked.stderr
    assert checked.stdout.startswith("OK: flow 'nested': 5 atoms")
    failed = call("check", "cli_flows:make_missing")
    assert failed.returncode == exits.ERROR
    assert "nowhere: needed by atom 'b'" in failed.stderr


def test_example_runs_a_flow_through_the_command() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "cli_run.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert "exit code 0: flow deploy SUCCESS" in out
    assert "exit code 3: flow deploy REVERTED" in out
    assert "  revert order: switch_traffic -> upload -> build" in out
    assert any(line.startswith("  failure: switch_traffic RuntimeError: health check failed")
               for line in out)


def _flow_id(result: Result) -> str:
    printed = lines(result) + result.stderr.splitlines()
    hint = next(line for line in printed if line.startswith("resume with: "))
    return hint.split()[5]


def test_resume_runs_on_the_engine_the_flow_ran_on(tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    first = invoke("run", "cli_flows:make_suspending", "--backend", uri,
                   "--engine", "parallel://?max_workers=2")
    assert first.exit_code == exits.SUSPENDED, first.output
    flow_id = _flow_id(first)
    again = invoke("run", "--resume", flow_id, "--backend", uri, "--json")
    assert again.exit_code == exits.OK, again.output
    assert json.loads(again.stdout)["engine"] == "parallel://?max_workers=2"
    # An engine given on the command line wins over the stored one.
    cli_flows.JOURNAL.clear()
    third = invoke("run", "--resume", flow_id, "--backend", uri, "--engine", "serial", "--json")
    assert json.loads(third.stdout)["engine"] == "serial"


def test_the_stored_run_keeps_no_secret(tmp_path: pathlib.Path) -> None:
    from flowengine.cli import stored_run

    saved = stored_run.record(
        "worker-based", {"url": "amqp://guest:hunter2@rabbit//", "exchange": "x",
                         "transport": None, "taskflow_compat": False,
                         "transport_options": {"sasl_password": "hunter2", "region": "eu"}},
        ["billing"])
    assert "hunter2" not in json.dumps(saved)
    assert saved["broker"]["url"] == "amqp://guest:***@rabbit//"
    assert saved["broker"]["transport_options"] == {"sasl_password": "***", "region": "eu"}
    assert saved["topics"] == ["billing"]

    # A resume that needs the password says so (exit 2) instead of failing to connect.
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    flow_id = _flow_id(invoke("run", "cli_flows:make_suspending", "--backend", uri))
    with backends.backend(uri) as backend:
        conn = backend.get_connection()
        fd = conn.get_flow_details(flow_id)
        fd.meta[stored_run.META_KEY] = saved
        conn.update_flow_details(fd)
    refused = invoke("run", "--resume", flow_id, "--backend", uri)
    assert refused.exit_code == exits.USAGE, refused.output
    assert "amqp://guest:***@rabbit//, whose password is not stored: give --url" in refused.output


def test_a_second_ctrl_c_stops_at_once_and_still_says_how_to_resume(
        tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    cli_flows.InterruptTwice.fired = False
    result = invoke("run", "cli_flows:make_impatient", "--backend", uri)
    assert result.exit_code == exits.INTERRUPTED, result.output
    # On stderr, beside the interruption (stdout may be --json's alone).
    assert "interrupted while suspending" in result.stderr
    assert "resume with: flowengine run --resume " in result.stderr
    flow_id = _flow_id(result)
    cli_flows.JOURNAL.clear()
    again = invoke("run", "--resume", flow_id, "--backend", uri)
    assert again.exit_code == exits.OK, again.output
    assert cli_flows.JOURNAL[-1] == "execute last"


def test_an_async_task_is_awaited_locally_and_on_workers() -> None:
    from flowengine.worker_based.worker import Worker

    assert invoke("run", "cli_flows:make_async").exit_code == exits.OK
    exchange = f"cli-async-{uuid.uuid4().hex[:8]}"
    worker = Worker(exchange=exchange, topic="t", tasks=[cli_flows.Waits], transport="memory",
                    threads_count=1, events=False)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert worker.wait(timeout=10), "the worker did not start"
        remote = invoke("run", "cli_flows:make_async", "--engine", "worker-based",
                        "--transport", "memory", "--exchange", exchange, "--topic", "t")
    finally:
        worker.stop(grace=5)
        thread.join(timeout=10)
    assert remote.exit_code == exits.OK, remote.output
    assert cli_flows.JOURNAL == ["execute waits", "execute waits"]


def test_a_resumed_flow_is_asked_for_its_secret_inputs(tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path}/flows.db"
    secret = "pa'ss-w0rd"
    first = invoke("run", "cli_flows:make_secretive", "--backend", uri, "--json",
                   "--store", f"password={secret}")
    assert first.exit_code == exits.REVERTED, first.output
    assert "pa" + "'ss-w0rd" not in first.output and "ss-w0rd" not in first.output
    flow_id = json.loads(first.stdout)["uuid"]
    cli_flows.JOURNAL.clear()
    asked = invoke("run", "--resume", flow_id, "--backend", uri)
    assert asked.exit_code != exits.OK and cli_flows.JOURNAL == []
    assert "MissingSecrets" in asked.output and "--store password=VALUE" in asked.output
    given = invoke("run", "--resume", flow_id, "--backend", uri, "--store", f"password={secret}")
    assert cli_flows.JOURNAL == ["execute login with 10 characters"], given.output
    shown = invoke("show", flow_id, "--backend", uri, "--tracebacks", "--full")
    assert "ss-w0rd" not in shown.output and "***" in shown.output


def test_a_value_given_with_secret_is_never_stored_nor_shown(tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path}/flows.db"
    ran = invoke("run", "cli_flows:make_greeting", "--backend", uri, "--json",
                 "--secret", "phrase=open-sesame-42")
    assert ran.exit_code == exits.OK, ran.output
    assert cli_flows.JOURNAL == ["execute greet"] and "sesame" not in ran.output
    shown = invoke("show", json.loads(ran.stdout)["uuid"], "--backend", uri, "--full")
    assert "said '***'" in shown.output and "sesame" not in shown.output
    assert b"sesame" not in (tmp_path / "flows.db").read_bytes()
