"""``flowengine run --deadline``, ``flowengine cancel`` and ``flowengine repair``: exit codes,
what is said, and what ``show`` says afterwards."""

from __future__ import annotations

import contextlib
import pathlib
import threading
from typing import Any

import cli_flows  # tests/unit is on sys.path (pytest rootdir insertion)
import pytest
from test_cli_run import clean_journal, invoke, lines  # noqa: F401 - a fixture

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.cli import exits
from flowengine.engines import suspend_requests as sr
from flowengine.persistence import backends, models


def _uri(tmp_path: pathlib.Path) -> str:
    return f"sqlite:///{tmp_path / 'flows.db'}"


def _flow_id(result: Any) -> str:
    first = lines(result)[0]  # "flow NAME (UUID) on ENGINE"
    return first.split("(", 1)[1].split(")", 1)[0]


def _stored(uri: str, flow_id: str) -> models.FlowDetail:
    backend = backends.fetch(uri)
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            return conn.get_flow_details(flow_id)
    finally:
        backend.close()


def test_run_with_a_deadline_that_expires_exits_7_reverted() -> None:
    result = invoke("run", "cli_flows:make_until_cancelled", "--deadline", "0.2")
    assert result.exit_code == exits.CANCELLED, result.output
    assert cli_flows.JOURNAL == ["execute a", "execute b", "stopped b", "revert b", "revert a"]
    out = lines(result)
    assert "REVERTED after" in out[-3] and out[-3].endswith("(exit code 7)"), out
    assert out[-2].startswith("cancelled by deadline at ") and out[-2].endswith(": deadline")
    assert out[-1] == "revert order: b -> a"


def test_cancel_of_a_suspended_flow_runs_its_reverts_here(tmp_path: pathlib.Path) -> None:
    uri = _uri(tmp_path)
    first = invoke("run", "cli_flows:make_suspending", "--backend", uri)
    assert first.exit_code == exits.SUSPENDED, first.output
    flow_id = _flow_id(first)
    cli_flows.JOURNAL.clear()

    result = invoke("cancel", flow_id[:8], "--reason", "customer gave up", "--backend", uri)
    assert result.exit_code == exits.CANCELLED, result.output
    assert "is SUSPENDED, not running anywhere" in result.stdout
    assert cli_flows.JOURNAL == []  # Echo has no revert to run; nothing executes
    stored = _stored(uri, flow_id)
    assert stored.state == states.REVERTED
    assert stored.meta["cancelled"]["reason"] == "customer gave up"
    assert stored.meta["cancelled"]["by"].endswith("(flowengine cancel)")

    shown = invoke("show", flow_id, "--backend", uri)
    assert any(line.startswith("  cancelled by ") and line.endswith(": customer gave up")
               for line in lines(shown)), shown.output


def test_cancel_of_a_flow_running_elsewhere_is_asked_and_waited_for(
        tmp_path: pathlib.Path) -> None:
    uri = _uri(tmp_path)
    backend = backends.fetch(uri)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    engine = engines.load(cli_flows.make_until_cancelled(), backend=backend,
                          book=models.LogBook("elsewhere"))
    raised: list[BaseException] = []

    def run() -> None:
        try:
            engine.run()
        except BaseException as err:
            raised.append(err)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        flow_id = engine.storage.flow_uuid
        _wait_for("execute b")  # b runs (and waits): the engine makes no transition meanwhile
        result = invoke("cancel", flow_id, "--reason", "wrong region", "--backend", uri,
                        "--wait", "60")
        assert result.exit_code == exits.CANCELLED, result.output
        assert "cancel requested for flow 'until-cancelled'" in result.stdout
        runner.join(30)
        assert isinstance(raised[0], exc.FlowCancelled)
        assert cli_flows.JOURNAL == ["execute a", "execute b", "stopped b", "revert b",
                                     "revert a"]
        stored = _stored(uri, flow_id)
        assert stored.meta["cancelled"]["reason"] == "wrong region"
        assert sr.META_CANCEL_REQUEST not in stored.meta  # answered
    finally:
        engine.cancel("test over")
        runner.join(30)
        backend.close()


def _wait_for(entry: str) -> None:
    """Until the journal has ``entry`` (written by a task on the engine's thread)."""
    assert cli_flows.JOURNAL.wait_for(entry, 30), f"no {entry!r} in {cli_flows.JOURNAL}"


def test_cancel_of_a_finished_flow_is_refused(tmp_path: pathlib.Path) -> None:
    uri = _uri(tmp_path)
    done = invoke("run", "cli_flows:make_ok", "--backend", uri)
    result = invoke("cancel", _flow_id(done), "--reason", "too late", "--backend", uri)
    assert result.exit_code == exits.USAGE
    assert "is SUCCESS: it ended, there is nothing to cancel" in result.stderr


def test_repair_retry_reverts_finishes_the_reverts_and_is_shown(
        tmp_path: pathlib.Path) -> None:
    uri = _uri(tmp_path)
    fault = tmp_path / "fault"
    fault.touch()
    failed = invoke("run", "cli_flows:make_revert_fault", "--kwarg", f"fault={fault}",
                    "--backend", uri)
    assert failed.exit_code == exits.FAILED, failed.output
    flow_id = _flow_id(failed)
    assert cli_flows.JOURNAL[-2:] == ["revert c", "revert-failed b"]

    refused = invoke("repair", flow_id, "--retry-from", "c", "--backend", uri)
    assert refused.exit_code == exits.USAGE
    assert "the revert of 'b'" in refused.stderr and "repair that first" in refused.stderr
    fault.unlink()
    cli_flows.JOURNAL.clear()
    repaired = invoke("repair", flow_id, "--retry-reverts", "--reason", "disk replaced",
                      "--backend", uri)
    assert repaired.exit_code == exits.REVERTED, repaired.output
    assert cli_flows.JOURNAL == ["revert b of 11", "revert a"]
    shown = lines(invoke("show", flow_id, "--backend", uri))
    assert shown[0].endswith(": REVERTED")
    line = next(line for line in shown if "retry-reverts" in line)
    assert line.endswith("(flowengine repair): disk replaced (atoms: b)"), line


def test_repair_is_refused_while_an_engine_holds_the_flow(tmp_path: pathlib.Path) -> None:
    uri = _uri(tmp_path)
    fault = tmp_path / "fault"
    fault.touch()
    flow_id = _flow_id(invoke("run", "cli_flows:make_revert_fault", "--kwarg",
                              f"fault={fault}", "--backend", uri))
    backend = backends.fetch(uri)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.change_flow_meta(flow_id, lambda fd: fd.meta.update(
            {sr.META_RUNNING_ON: sr.running_on("SerialActionEngine")}))
    backend.close()
    result = invoke("repair", flow_id, "--mark-reverted", "b", "--reason", "deleted",
                    "--backend", uri)
    assert result.exit_code == exits.USAGE
    assert "is held by its SerialActionEngine in pid" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    ((), "give exactly one of --retry-reverts"),
    (("--retry-reverts", "--retry-from", "b"), "give exactly one of"),
    (("--mark-reverted", "b"), "mark-reverted needs a reason"),
])
def test_repair_usage_errors_name_what_is_wrong(tmp_path: pathlib.Path, args: tuple[str, ...],
                                                message: str) -> None:
    result = invoke("repair", "some-flow", "--backend", _uri(tmp_path), *args)
    assert result.exit_code == exits.USAGE
    assert message in result.output
