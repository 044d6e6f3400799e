"""``flowengine flows``/``show`` on every backend, and ``graph``/``check`` without running."""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Iterator

import cli_flows  # noqa: F401  (tests/unit is on sys.path; the specs below import it)
import pytest
from click.testing import CliRunner, Result

from flowengine.cli import exits
from flowengine.cli.main import cli

#: The flows stored by the ``stored`` fixture: name -> exit code of its run.
RUNS = {
    "make_ok": exits.OK,
    "make_reverted": exits.REVERTED,
    "make_revert_fails": exits.FAILED,
    "make_suspending": exits.SUSPENDED,
    "make_nested": exits.OK,
}


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def invoke(*args: str) -> Result:
    env: dict[str, str | None] = {key: None for key in os.environ
                                  if key.startswith("FLOWENGINE_")}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


@pytest.fixture(params=["sqlite", "dir", "postgresql"])
def backend_uri(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    if request.param == "postgresql":
        yield request.getfixturevalue("postgres_schema_url")
    elif request.param == "dir":
        yield f"dir://{tmp_path / 'flows'}"
    else:
        yield f"sqlite:///{tmp_path / 'flows.db'}"


@pytest.fixture
def stored(backend_uri: str) -> dict[str, str]:
    """Runs every flow of RUNS into the backend; returns flow name -> uuid."""
    uuids: dict[str, str] = {}
    for factory, code in RUNS.items():
        result = invoke("run", f"cli_flows:{factory}", "--backend", backend_uri, "--json")
        assert result.exit_code == code, result.output
        outcome = json.loads(result.stdout)
        uuids[outcome["flow"]] = outcome["uuid"]
    return uuids


def test_flows_lists_states_counts_and_updates(backend_uri: str,
                                               stored: dict[str, str]) -> None:
    result = invoke("flows", "--backend", backend_uri)
    assert result.exit_code == exits.OK, result.output
    header, *rows = map(columns, result.stdout.splitlines())
    assert header == ["FLOW", "NAME", "STATE", "ATOMS", "UPDATED", "BOOK"]
    by_uuid = {row[0]: row for row in rows}
    assert set(by_uuid) == set(stored.values())
    reverted = by_uuid[stored["reverted"]]
    assert reverted[1:4] == ["reverted", "REVERTED", "2 (2 REVERTED)"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", reverted[4])
    assert reverted[5] == "flowengine-cli"
    assert by_uuid[stored["revert-fails"]][3] == "2 (1 REVERTED, 1 REVERT_FAILURE)"
    # Counts follow the life of an atom: PENDING first, SUCCESS after.
    assert by_uuid[stored["suspending"]][2:4] == ["SUSPENDED", "3 (1 PENDING, 2 SUCCESS)"]


def test_flows_json_and_state_filter(backend_uri: str, stored: dict[str, str]) -> None:
    result = invoke("flows", "--backend", backend_uri, "--json")
    assert result.exit_code == exits.OK
    found = {flow["name"]: flow for flow in map(json.loads, result.stdout.splitlines())}
    assert set(found) == set(stored)
    ok = found["ok"]
    assert ok["state"] == "SUCCESS" and ok["atoms"] == 2 and ok["atom_states"] == {"SUCCESS": 2}
    assert ok["factory"] == "cli_flows.make_ok" and ok["book"] == "flowengine-cli"
    assert ok["updated_at"].endswith("Z")

    only = invoke("flows", "--backend", backend_uri, "--json", "--state", "reverted",
                  "--state", "FAILURE")
    assert sorted(json.loads(line)["name"] for line in only.stdout.splitlines()) == [
        "revert-fails", "reverted"]


def test_flows_refuses_a_state_no_flow_can_be_in(tmp_path: pathlib.Path) -> None:
    result = invoke("flows", "--backend", f"sqlite:///{tmp_path / 'flows.db'}", "--state", "BOGUS")
    assert result.exit_code == exits.USAGE
    assert "'BOGUS' is not one of 'failure', 'pending', 'resuming', 'reverted'," in result.output


def test_show_text(backend_uri: str, stored: dict[str, str]) -> None:
    result = invoke("show", stored["revert-fails"], "--backend", backend_uri)
    assert result.exit_code == exits.OK, result.output
    out = result.stdout.splitlines()
    assert out[0] == f"flow revert-fails ({stored['revert-fails']}): FAILURE"
    assert "  factory: cli_flows.make_revert_fails" in out
    header = columns(next(line for line in out if line.startswith("ATOM")))
    assert header == ["ATOM", "KIND", "STATE", "INTENTION", "PROGRESS", "STARTED", "DURATION",
                      "REVERT", "RESULT"]
    rows = {line[0]: dict(zip(header, columns(line)))
            for line in out if line.startswith(("a ", "b "))}
    assert list(rows) == ["a", "b"]  # in the order they ran
    assert rows["a"]["STATE"] == "REVERT_FAILURE" and rows["a"]["INTENTION"] == "REVERT"
    assert rows["b"]["STATE"] == "REVERTED" and rows["b"]["PROGRESS"] == "100%"
    assert re.fullmatch(r"\d+\.\d\ds", rows["b"]["REVERT"])
    assert rows["b"]["STARTED"].endswith("Z")
    assert "  a (revert): ValueError: a cannot be undone" in out
    assert "  b (execute): RuntimeError: b cannot go on" in out
    assert "  (--tracebacks shows where each was raised)" in out
    assert "Traceback" not in result.stdout

    traced = invoke("show", stored["revert-fails"], "--backend", backend_uri, "--tracebacks")
    assert "    Traceback (most recent call last):" in traced.stdout
    assert 'raise ValueError(f"{self.name} cannot be undone")' in traced.stdout


def test_show_retry_attempts(backend_uri: str, stored: dict[str, str]) -> None:
    result = invoke("show", stored["nested"][:8], "--backend", backend_uri)
    assert result.exit_code == exits.OK, result.output
    header = columns(next(line for line in result.stdout.splitlines()
                          if line.startswith("ATOM")))
    assert "ATTEMPTS" in header and "WORKERS" not in header
    again = dict(zip(header, columns(next(line for line in result.stdout.splitlines()
                                          if line.startswith("again ")))))
    assert (again["KIND"], again["STATE"], again["ATTEMPTS"]) == ("retry", "SUCCESS", "1")
    assert again["RESULT"] == "1"


def test_show_shortens_results_unless_full(tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    flow_id = json.loads(invoke("run", "cli_flows:make_long", "--backend", uri,
                                "--json").stdout)["uuid"]
    short = invoke("show", flow_id, "--backend", uri).stdout
    assert f" {'x' * 59}…\n" in short and "x" * 60 not in short
    full = invoke("show", flow_id, "--backend", uri, "--full").stdout
    assert f" {'x' * 100}\n" in full


def test_show_json(backend_uri: str, stored: dict[str, str]) -> None:
    result = invoke("show", stored["reverted"], "--backend", backend_uri, "--json")
    assert result.exit_code == exits.OK, result.output
    shown = json.loads(result.stdout)
    assert shown["flow"]["state"] == "REVERTED"
    assert shown["flow"]["meta"]["factory"]["name"] == "cli_flows.make_reverted"
    a, b = shown["atoms"]
    assert (a["name"], a["kind"], a["state"], a["intention"]) == ("a", "task", "REVERTED",
                                                                  "REVERT")
    assert a["result"] == 2 and a["failure"] is None
    assert a["duration"] >= 0 and a["revert_duration"] >= 0 and a["started_at"].endswith("Z")
    assert b["failure"]["type"] == "RuntimeError" and "raise RuntimeError" in b["failure"][
        "traceback"]
    assert a["workers"] is None and a["attempts"] is None


def test_show_unknown_or_ambiguous_flow_exits_2(backend_uri: str,
                                                stored: dict[str, str]) -> None:
    missing = invoke("show", "no-such-flow", "--backend", backend_uri)
    assert missing.exit_code == exits.USAGE
    assert "Invalid value for FLOW_ID: no flow 'no-such-flow'" in missing.stderr
    ambiguous = invoke("show", "", "--backend", backend_uri)
    assert ambiguous.exit_code == exits.USAGE
    assert f"is the start of {len(stored)} flow ids" in ambiguous.stderr


def test_a_backend_that_does_not_exist_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    for args in (("flows",), ("show", "x")):
        result = invoke(*args, "--backend", f"sqlite:///{tmp_path / 'typo.db'}")
        assert result.exit_code == exits.USAGE
        assert "typo.db does not exist" in result.stderr
    assert not (tmp_path / "typo.db").exists()


def test_no_flows() -> None:
    result = invoke("flows", "--backend", "memory://")
    assert result.exit_code == exits.OK
    assert result.stdout == "no flows\n"


# -- graph -----------------------------------------------------------------------------------


def test_graph_dot_clusters_retries_and_deciders() -> None:
    result = invoke("graph", "cli_flows:make_nested", "--format", "dot")
    assert result.exit_code == exits.OK, result.output
    dot = result.stdout
    assert dot.startswith('digraph "nested" {')
    assert 'label="nested (graph_flow)";' in dot
    cluster = dot[dot.index("subgraph cluster_0 {"):]
    assert cluster.index('label="pair (unordered_flow)";') < cluster.index('"left"') \
        < cluster.index("}")
    assert '"again" [label="again", shape=hexagon];' in dot
    assert '"fetch" -> "again";' in dot
    assert '"again" -> "left";' in dot and '"again" -> "right";' in dot
    assert '"fetch" -> "report" [style=dashed, label="decider: <lambda>@ATOM"];' in dot
    assert "FlowStart" not in dot and "<start of" not in dot


def test_graph_mermaid() -> None:
    result = invoke("graph", "cli_flows:make_nested", "--format", "mermaid")
    assert result.exit_code == exits.OK
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert lines[0] == "flowchart LR"
    ids = {m.group(2): m.group(1) for m in
           (re.match(r'(a\d+)(?:\[|\{\{)"([^"]+)"', line) for line in lines) if m}
    assert set(ids) == {"fetch", "report", "again", "left", "right"}
    assert f'{ids["again"]}{{{{"again"}}}}' in lines
    assert 'subgraph f0["pair (unordered_flow)"]' in lines and "end" in lines
    assert f'{ids["fetch"]} -.->|"decider: <lambda>@ATOM"| {ids["report"]}' in lines
    assert f"{ids['again']} --> {ids['left']}" in lines


def test_graph_json() -> None:
    result = invoke("graph", "cli_flows:make_nested", "--format", "json")
    assert result.exit_code == exits.OK
    graph = json.loads(result.stdout)
    kinds = {node["name"]: node["kind"] for node in graph["nodes"]}
    assert kinds == {"fetch": "task", "report": "task", "again": "retry", "left": "task",
                     "right": "task"}
    where = {node["name"]: node["flows"] for node in graph["nodes"]}
    assert where["left"] == ["nested", "pair"] and where["fetch"] == ["nested"]
    edges = {(e["source"], e["target"]): e["deciders"] for e in graph["edges"]}
    assert edges == {("fetch", "again"): [], ("fetch", "report"): ["<lambda>@ATOM"],
                     ("again", "left"): [], ("again", "right"): []}
    assert graph["flow"]["flows"][0]["name"] == "pair"


def test_graph_of_a_linear_flow_object() -> None:
    result = invoke("graph", "cli_flows:make_ok", "--format", "json")
    edges = [(e["source"], e["target"]) for e in json.loads(result.stdout)["edges"]]
    assert edges == [("a", "b")]


def test_graph_format_from_environment() -> None:
    result = CliRunner().invoke(cli, ["graph", "cli_flows:make_ok"],
                                env={"FLOWENGINE_FORMAT": "mermaid"})
    assert result.stdout.startswith("flowchart LR")


# -- check -----------------------------------------------------------------------------------


def test_check_ok_with_counts() -> None:
    result = invoke("check", "cli_flows:make_nested")
    assert result.exit_code == exits.OK, result.output
    assert result.stdout == ("OK: flow 'nested': 5 atoms (4 tasks, 1 retry) in 2 flows, "
                             "4 links\n")


def test_check_names_what_the_flow_needs_and_accepts_store_values() -> None:
    missing = invoke("check", "cli_flows:make_needs_x")
    assert missing.exit_code == exits.ERROR
    # The inputs, then who needs them: not TaskFlow's nested chain of errors.
    assert missing.stderr.splitlines() == [
        "error: flow 'needs-x': MissingDependencies: it needs input(s) nothing in it provides: x",
        "  x: needed by atom 'a' (execute)",
        "hint: give them with --store NAME=VALUE (--store x=VALUE)"]
    given = invoke("check", "cli_flows:make_needs_x", "--store", "x=1")
    assert given.exit_code == exits.OK
    assert given.stdout.splitlines() == [
        "OK: flow 'needs-x': 1 atom (1 task, 0 retries) in 1 flow, 0 links",
        "inputs it needs from outside (--store): x"]


def test_check_missing_dependencies_names_the_atom() -> None:
    result = invoke("check", "cli_flows:make_missing")
    assert result.exit_code == exits.ERROR
    assert result.stdout == ""
    assert result.stderr.startswith("error: flow 'missing': MissingDependencies: ")
    assert "  nowhere: needed by atom 'b' (execute, revert)" in result.stderr.splitlines()


def test_check_import_errors_exit_1() -> None:
    result = invoke("check", "cli_flows:make_bad")
    assert result.exit_code == exits.ERROR
    assert "returned 42 (int), not a flow or an atom" in result.stderr
