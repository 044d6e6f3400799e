"""Run every script in examples/ as a user would, and check the lines that tell its story."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: The demo's stores, one per run, all removed when the test process ends.
_STORES = tempfile.TemporaryDirectory(prefix="demo-stores-")

Runs = dict[str, "concurrent.futures.Future[subprocess.CompletedProcess[str]]"]

#: Scripts that need servers (a broker, a database); they are exercised by integration tests.
#: wbe_cluster.py needs the cluster suite's RabbitMQ (tests/integration/test_cluster_rabbitmq.py).
NEEDS_SERVERS: frozenset[str] = frozenset({"wbe_cluster.py"})

#: Lines each script must print, in this order (other lines may come between them). A script
#: without an entry must still exit with status 0 and print something.
EXPECTED_LINES: dict[str, list[str]] = {
    "engine_hooks.py": [
        "hooks: ['AtomLogHook', 'TracingHook', 'Timing']",
        "calls: ['reserve', 'reserve', 'reserve']",
        "decisions: ['RETRY by again']",
        "without the atom log: ['reserve']",
        "event: flow-started",
        "event: task-started",
        "event: task-succeeded",
        "event: flow-succeeded",
        "stored end state: SUCCESS",
        "the worker's hook: ['serve reserve (attempt 1, topic booking)', 'reply SUCCESS']",
    ],
    "readme_booking.py": ["reserved 12A"],
    "custom_executor.py": [
        "audited:",
        "EXECUTE reserve with {'seat': '12A'}",
        "EXECUTE charge with {'seat': '12A'}",
        "REVERT reserve with {'seat': '12A'}",
        "failed: card declined for 12A; flow REVERTED",
        "taskflow-style:",
        "execute_task(reserve)",
        "revert_task(charge)",
        "revert_task(reserve)",
        "undo reservation of 12A",
        "failed: card declined for 12A; flow REVERTED",
    ],
    "engine_options.py": [
        "serial: hello",
        "parallel: hello",
        "refused: Unknown serial engine option(s): 'nevr_resolve' (did you mean "
        "'never_resolve'?)",
    ],
    "chaos_orders.py": ["parcel-1"],
    "rehearse_booking.py": [
        "== booking",
        "every revert twice            E/R+R         E/R+R!       x/R+R        REVERTED    "
        "FINDING",
        "verdict: 8 runs on the serial engine, 1 finding(s): the flow is NOT proven safe",
        "every revert twice: charge_card: revert not idempotent: its second revert changed "
        "balance from 0 to 120",
        "== fixed_booking",
        "verdict: 8 runs on the serial engine, no finding: every failure point is undone "
        "safely",
    ],
    "rehearse_careless.py": [
        "verdict: 8 runs on the serial engine, 2 finding(s): the flow is NOT proven safe",
        "fail execute of charge_card: charge_card: revert assumes its execute ran: its execute "
        "never completed, yet its revert changed balance from None to 120",
    ],
    "cancel_flow.py": [
        "copy_data: copying into vol-1 (flow provision, attempt 1)",
        "operator: cancel it (the customer deleted the order)",
        "copy_data: asked to stop (the customer deleted the order)",
        "run raised FlowCancelled: the customer deleted the order (asked by operator)",
        "revert order: copy_data -> attach -> create_volume",
        "flow state: REVERTED; cancelled by operator: the customer deleted the order",
        "copy_data: asked to stop (deadline)",
        "with a 0.5s deadline: REVERTED (deadline); revert order: copy_data -> attach -> "
        "create_volume",
    ],
    "repair_flow.py": [
        "revert reserve_address: cannot release 10.0.0.7: the IP API is down",
        "flow state: FAILURE; reserve_address is REVERT_FAILURE",
        "revert reserve_address: released 10.0.0.7",
        "revert create_server: deleted server-7",
        "flow state: REVERTED; repaired: retry-reverts by ops (IP API restored), atoms "
        "['reserve_address']",
        "flow state: FAILURE; reserve_address is REVERT_FAILURE",
        "revert create_server: deleted server-7",
        "flow state: REVERTED; reserve_address is REVERTED",
    ],
    "suspend_elsewhere.py": [
        "flow copy-files is RUNNING in another process: True",
        "asked, and acknowledged: True",
        "the engine process exited with 0",
        "flow state: SUSPENDED; the last step ran: False",
        "resumed here: SUCCESS, 5 steps done",
    ],
    "wbe_autoscale.py": ["task threads at start: 1", "flow SUCCESS"],
    "wbe_async.py": [
        # The worker's own order: the cancelled call's cleanup ends before the revert starts.
        "reserve: REVERTED, revert result 'released slot-7'",
        "worker: call: cancelled by its time limit; hung up",
        "worker: reserve: released slot-7",
        "flow state: REVERTED",
    ],
    "wbe_frozen_worker.py": [
        "hold started on worker a, which was then frozen",
        "hold ran on worker b (attempt 2): SUCCESS",
        "4 flows started after the verdict ran on: b x4; their requests went to: cell-b x4",
    ],
    "wbe_short_tasks.py": ["default: quiet starts off, total 20, flow SUCCESS",
                           "quiet_start=True: quiet starts on, total 20, flow SUCCESS"],
    "locks_and_limits.py": [
        "update-lb and delete-lb ran one after the other: True",
        "10 reboots done, most at once: 3 (limit 3)",
    ],
    "resume_after_deploy.py": [
        "reserve ran",
        "flow SUSPENDED",
        "code v2 resumes it:",
        "refused: added atom 'charge' (resume_after_deploy.Step 1.0)",
        "$ flowengine check --backend ... -> exit 1",
        "added atom 'charge' (resume_after_deploy.Step 1.0)",
        "with a migration registered for it:",
        "charge ran",
        "ship ran",
        "flow SUCCESS",
    ],
    "migrate_from_taskflow.py": [
        "taskflow: create_network ran",
        "taskflow: create_volume ran",
        "taskflow: boot_server starts, and the TaskFlow service is killed",
        "the TaskFlow service died (exit code -9)",
        "$ flowengine db import-taskflow --from sqlite:///taskflow.db --backend "
        "sqlite:///flowengine.db",
        "TaskFlow store 'sqlite:///taskflow.db' -> sqlalchemy backend 'sqlite:///flowengine.db': "
        "1 flow(s): 1 imported; 1 logbook(s) added",
        "flow provision is RUNNING in the copy; resuming it",
        "flowengine: boot_server ran",
        "flowengine: attach_address ran",
        "flow SUCCESS: 203.0.113.7 -> srv-7 (net-7, vol-7)",
        "ran under flowengine: boot_server, attach_address",
    ],
    "start_delay.py": [
        "place_order runs",
        "notify_customer waits 1.5s before it starts (task delay)",
        "notify_customer runs for order-17",
        "notify_customer waited its 1.5s: True",
        "flow SUCCESS",
    ],
    "wbe_priorities.py": ["sent weekly (priority 1)", "served in order: outage, daily, weekly"],
    "wbe_delayed_retry.py": [
        "again waits 2.0s before attempt 2",
        "charge is RUNNING, delayed until its due time: True",
        "queued for workers: 0, held by this process: 1",
        "flow SUCCESS: charged on attempt 2",
    ],
    "wbe_pause.py": [
        "topic orders paused: True",
        "after 1s paused, the flow is still running: True",
        "reserve_stock: reserving 2 x widget",
        "after resume: flow SUCCESS, reservation rsv-widget-2",
    ],
    "hello_linear.py": [
        "greet: building a greeting for world",
        "shout: turning 'Hello, world' up",
        "show: HELLO, WORLD!",
        "results: greeting='Hello, world' shouted='HELLO, WORLD!'",
    ],
    "graph_inferred.py": [
        "inferred link: compile -> package",
        "inferred link: compile -> test",
        "inferred link: fetch_deps -> compile",
        "inferred link: fetch_source -> compile",
        "inferred link: package -> publish",
        "inferred link: test -> publish",
        "every step ran after the steps it needs",
        "publish returned 'publish(package, test)'",
    ],
    "reverting.py": [
        "execute flight: reserved flight-42",
        "execute charge: charging 1200",
        "revert  charge: nothing to undo (card declined for 1200)",
        "revert  car: cancelled car-42 (because card declined for 1200)",
        "revert  hotel: cancelled hotel-42 (because card declined for 1200)",
        "revert  flight: cancelled flight-42 (because card declined for 1200)",
        "run raised CardDeclined: card declined for 1200",
        "revert order: charge -> car -> hotel -> flight",
        "flow state: REVERTED",
    ],
    "retry_flow.py": [
        "upload: cleaning up the partial upload of attempt 1",
        "upload-retry: waiting 0.05s before attempt 2",
        "upload-retry: wait over, attempt 2 starts",
        "upload: cleaning up the partial upload of attempt 2",
        "upload-retry: waiting 0.10s before attempt 3",
        "upload-retry: wait over, attempt 3 starts",
        "result: uploaded on attempt 3",
        "download: mirror-a is unreachable",
        "download: mirror-b is unreachable",
        "download: fetched from mirror-c",
        "result: downloaded from mirror-c",
    ],
    "parallel_map_reduce.py": [
        "partial sums: [4900, 35525, 97400, 190525]",
        "halves: [2450, 17762, 48700, 95262]",
        "total: 328350 (expected 328350)",
    ],
    "deciders.py": [
        "== usage 95%: the clean-up branch runs ==",
        "clean_up: removing old logs",
        "states: inspect=SUCCESS, clean_up=SUCCESS, compact=SUCCESS, report=SUCCESS",
        "== usage 40%: the decider skips the clean-up branch ==",
        "states: inspect=SUCCESS, clean_up=IGNORE, compact=IGNORE, report=SUCCESS",
        "flow state: SUCCESS",
        "states: inspect=SUCCESS, clean_up=IGNORE, compact=SUCCESS, report=SUCCESS",
    ],
    "notifications.py": [
        "flow  backup: PENDING -> RUNNING",
        "atom  copy: PENDING -> RUNNING",
        "progress copy: 25%",
        "progress copy: 50%",
        "progress copy: 75%",
        "atom  copy: RUNNING -> SUCCESS result=4",
        "atom  verify: RUNNING -> SUCCESS result=True",
        "flow  backup: RUNNING -> SUCCESS",
        "stored progress of copy: 1.0",
    ],
    "async_and_time_limits.py": [
        "healthy hosts: 50 of 50",
        "reserve: reserved an address",
        # The engine waits for the cancelled coroutine's cleanup before it reverts.
        "wait_for_boot: cancelled by its time limit",
        "reserve: released 10.0.0.7",
        "run raised TaskTimeLimitExceeded: Task 'wait_for_boot' exceeded its time limit of 0.5s",
    ],
    "secret_inputs.py": [
        "first run failed: WrappedFailure: [Failure: ConnectionError: API down for {'dsn': "
        "'postgresql://deploy:***@db/app', 'token': '***'} "
        '({"dsn": "postgresql://deploy:***@db/app", "token": "***"})]',
        "stored secret inputs: ['api_token', 'db_password']",
        "stored failure: API down for {'dsn': 'postgresql://deploy:***@db/app', 'token': '***'} "
        '({"dsn": "postgresql://deploy:***@db/app", "token": "***"})',
        "password in the database file: False",
        "token in the database file: False",
        "resume without them: MissingSecrets for ['api_token', 'db_password']",
        "resumed with them: SUCCESS, deployed with 10-character token",
    ],
    "main_job.py": [
        "health_check   ✔ done -> ok",
        "flow state: SUCCESS",
        "health_check   ✘ failed: server did not answer on port 22",
        "engine.run() raised RuntimeError: server did not answer on port 22",
        "flow state: REVERTED",
    ],
}


def _values_after(output: str, prefix: str) -> list[str]:
    """The ``a -> b -> c`` list printed on the first line starting with ``prefix``."""
    for line in output.splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].strip().split(" -> ")
    raise AssertionError(f"no line starts with {prefix!r}")


def _check_graph_order(output: str) -> None:
    order = _values_after(output, "execution order:")
    assert sorted(order) == sorted(
        ["fetch_source", "fetch_deps", "compile", "test", "package", "publish"])
    assert order.index("compile") > max(order.index("fetch_source"), order.index("fetch_deps"))
    assert order[-1] == "publish"


def _check_main_job_reverts(output: str) -> None:
    order = _values_after(output, "revert order:")
    # An atom reverts only after everything that ran after it and depends on it has reverted:
    # health_check, then attach_volume; boot_server before the ip and image it used. Steps that
    # do not depend on each other (create_volume and boot_server, say) may come in either order.
    assert order[:2] == ["health_check", "attach_volume"]
    assert sorted(order) == sorted(["health_check", "attach_volume", "boot_server",
                                    "create_volume", "allocate_ip", "fetch_image"])
    assert order.index("boot_server") < min(order.index("allocate_ip"),
                                            order.index("fetch_image"))


def _check_hooks(output: str) -> None:
    part1, part2 = output.split("decisions:", 1)
    # The defaults stayed on the first engine (its atom log wrote lines); the second had only
    # the example's hook, so no atom log line follows.
    assert "flowengine.atoms: atom=reserve state=FAILURE" in part1, output
    assert "flowengine.atoms" not in part2, output


def _check_pool_grew(output: str) -> None:
    assert "(the pool grew: True)" in output, output
    assert "stats: 0 in flight, 4 of 4 slots free" in output, output  # every nap settled


def _check_parallelism(output: str) -> None:
    most = int(_values_after(output, "most tasks running at once:")[0])
    assert most >= 2, "the parallel engine ran the map tasks one at a time"


EXTRA_CHECKS: dict[str, Callable[[str], None]] = {
    "engine_hooks.py": _check_hooks,
    "graph_inferred.py": _check_graph_order,
    "main_job.py": _check_main_job_reverts,
    "parallel_map_reduce.py": _check_parallelism,
    "wbe_autoscale.py": _check_pool_grew,
}


def _scripts() -> list[str]:
    """Runnable scripts; modules without a ``__main__`` guard are helpers other scripts import."""
    return sorted(
        p.name for p in EXAMPLES.glob("*.py")
        if p.name not in NEEDS_SERVERS and 'if __name__ == "__main__":' in p.read_text()
    )


def _run(script: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONIOENCODING="utf-8", NO_COLOR="1")
    # demo_workers.py's store: its own per run, not one kept from another flowengine version.
    env["FLOWENGINE_DEMO_STORE"] = f"sqlite:///{tempfile.mkdtemp(dir=_STORES.name)}/demo.db"
    env.pop("FORCE_COLOR", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8", timeout=120,
    )


#: Scripts run at the same time. Most wait on sleeps and workers, but the worker-based ones start
#: two worker processes each: all at once on two cores starved some past their start-up wait.
CONCURRENT_SCRIPTS = 6


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    """Start the scripts a few at a time, collect lazily."""
    scripts = _scripts()
    with concurrent.futures.ThreadPoolExecutor(max_workers=CONCURRENT_SCRIPTS) as pool:
        yield {script: pool.submit(_run, script) for script in scripts}


def assert_lines_in_order(output: str, expected: list[str]) -> None:
    """Each expected line appears (whole, ignoring surrounding spaces) after the previous one."""
    lines = [line.strip() for line in output.splitlines()]
    position = 0
    for wanted in expected:
        try:
            position = lines.index(wanted, position) + 1
        except ValueError:
            raise AssertionError(
                f"missing (or out of order): {wanted!r}\n--- output\n{output}"
            ) from None


def test_the_scripts_with_expectations_exist() -> None:
    missing = sorted(set(EXPECTED_LINES) - set(_scripts()))
    assert not missing, f"EXPECTED_LINES names scripts that are gone: {missing}"


@pytest.mark.timeout(180)  # the slowest example took 19 s on a loaded 2-core machine
@pytest.mark.parametrize("script", _scripts())
def test_example(script: str, runs: Runs) -> None:
    proc = runs[script].result()
    assert proc.returncode == 0, (
        f"{script} exited with {proc.returncode}\n--- stdout\n{proc.stdout}\n"
        f"--- stderr\n{proc.stderr}"
    )
    output = proc.stdout
    assert output.strip(), f"{script} printed nothing"
    assert_lines_in_order(output, EXPECTED_LINES.get(script, []))
    check = EXTRA_CHECKS.get(script)
    if check is not None:
        check(output)


def test_assert_lines_in_order_rejects_wrong_order() -> None:
    with pytest.raises(AssertionError):
        assert_lines_in_order("b\na\n", ["a", "b"])
