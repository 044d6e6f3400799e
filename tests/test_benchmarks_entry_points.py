"""``benchmarks/engines.py``, ``events_cost.py``, ``kombu_ceiling.py``, ``remote_path.py`` and
``setup_cost.py`` at tiny sizes.

Nothing else runs these, so a change that breaks one would show only when someone next
measures. Each runs as ``make bench`` runs it; the report's shape is checked, never a number.
"""

from __future__ import annotations

import pytest
from benchmark_runs import run_benchmark  # tests/ is on sys.path (rootdir conftest)


@pytest.mark.timeout(180)  # eight interpreter starts: 15 s here, more on a loaded machine
def test_engines_reports_every_shape_size_and_engine_and_back_to_back_runs() -> None:
    report = run_benchmark("engines.py", "--sizes", "5", "--engines", "serial", "parallel",
                           "--runs", "3")
    assert report["benchmark"] == "engines"
    rows = {(row["shape"], row["size"], row["engine"]): row for row in report["results"]}
    assert set(rows) == {(shape, 5, engine) for shape in ("linear", "unordered", "chain-graph")
                         for engine in ("serial", "parallel")}
    for row in rows.values():
        measured = row["flowengine"]
        assert "error" not in measured, row
        assert measured["run_s"] > 0 and measured["tasks_per_s"] > 0
        assert measured["peak_rss_mb"] > 0
    assert [row["engine"] for row in report["back_to_back"]] == ["serial", "parallel"]
    for row in report["back_to_back"]:
        assert row["flowengine"]["runs"] == 3 and row["flowengine"]["ms_per_run"] > 0, row


def test_events_cost_reports_each_mode_and_what_an_emit_costs_with_the_broker_away() -> None:
    report = run_benchmark("events_cost.py", "--tasks", "6", "--linear", "3", "--repeat", "1",
                           "--threads", "2", "--away-emits", "200")
    assert report["benchmark"] == "events_cost" and report["transport"] == "memory"
    for shape, size in (("unordered", 6), ("linear", 3)):
        assert report[shape]["tasks"] == size
        assert set(report[shape]) == {"tasks", "off", "on", "on_read"}
        assert report[shape]["off"]["ratio"] == 1.0
        assert all(report[shape][mode]["run_s"] > 0 for mode in ("off", "on", "on_read"))
    assert report["events_published"] > 0
    away = report["emit_away"]
    assert away["emits"] == 200 and away["us_per_emit"] > 0
    assert away["dropped"] >= 200 - 2 * 100, "the queue of 100 kept more than it can hold"


def _ceiling_rows(report: dict[str, object], brokers: list[str]) -> None:
    assert report["benchmark"] == "kombu_ceiling"
    rows = report["results"]
    assert isinstance(rows, list) and [row["broker"] for row in rows] == brokers
    for row in rows:
        assert "error" not in row, row
        assert row["sequential"]["n"] == 5 and row["sequential"]["p50_ms"] > 0, row
        assert row["pipelined"]["n"] == 20 and row["pipelined"]["replies_per_s"] > 0, row


def test_kombu_ceiling_measures_round_trips_on_the_filesystem_transport() -> None:
    report = run_benchmark("kombu_ceiling.py", "--brokers", "fs", "--sequential", "5",
                           "--pipelined", "20", "--time-limit", "60")
    _ceiling_rows(report, ["fs"])


def test_kombu_ceiling_measures_round_trips_on_redis_and_beanstalkd(
        redis_url: str, beanstalk_url: str) -> None:
    report = run_benchmark("kombu_ceiling.py", "--brokers", "redis", "beanstalk",
                           "--sequential", "5", "--pipelined", "20", "--time-limit", "60",
                           env={"FLOWENGINE_BENCH_REDIS_URL": redis_url,
                                "FLOWENGINE_BENCH_BEANSTALK_URL": beanstalk_url})
    _ceiling_rows(report, ["redis", "beanstalk"])


@pytest.mark.timeout(180)
def test_remote_path_lists_the_modules_one_request_crosses_on_both_projects() -> None:
    report = run_benchmark("remote_path.py", "--list")
    assert report["benchmark"] == "remote_path" and report["transport"] == "memory"
    for project in ("flowengine", "taskflow"):
        row = report[project]
        assert "error" not in row, row
        assert row["modules"] == len(row["names"]) == row["engine_thread"] + row["other_threads"]
        assert all(name.startswith(project) for name in row["names"]), row["names"]
        # The request's own path: what the worker-based run crossed and a serial run did not.
        assert row["remote_only"] == len(row["remote_names"]) > 0
        assert set(row["remote_names"]) <= set(row["names"])
        # The engine core every engine runs is not counted in it; the remote executor is.
        assert f"{project}.storage" not in row["remote_names"]
        assert any(name.endswith("worker_based.executor") for name in row["remote_names"])
    names = report["flowengine"]["names"]
    # The request went out and came back: the executor, the worker's server and the task ran.
    for module in ("flowengine.worker_based.executor", "flowengine.worker_based.server",
                   "flowengine.worker_based.endpoint"):
        assert module in names
    state = report["live_state"]
    assert state["registries"] == len(state["registry_names"]) > 0
    assert "flowengine.worker_based.client._clients" in state["registry_names"]
    assert state["fork_hooks"] > 0 and state["exit_hooks"] >= 0


def test_setup_cost_reports_each_stage_on_both_engines_and_the_compilers_share() -> None:
    report = run_benchmark("setup_cost.py", "--sizes", "3", "20", "--flows", "10")
    assert report["benchmark"] == "setup_cost"
    assert [row["size"] for row in report["results"]] == [3, 20]
    for row in report["results"]:
        assert row["pattern_compile_ms"] > 0 and row["graph_copy_ms"] > 0, row
        for engine in ("serial", "worker-based"):
            stages = row[engine]
            assert set(stages) == {"build_ms", "load_ms", "compile_ms", "prepare_ms",
                                   "validate_ms", "set_up_ms"}, row
            assert stages["set_up_ms"] > 0, row
