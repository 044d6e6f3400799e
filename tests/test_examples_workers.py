"""Run the worker-based examples as a user would and check the lines that tell their story.

They start real ``flowengine worker`` processes (or a worker thread) over the ``flowengine-fs``
and memory transports, so they need no server. Each test also checks that no worker process
outlives its script.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: The demo's stores, one per run, all removed when the test process ends.
_STORES = tempfile.TemporaryDirectory(prefix="demo-stores-")
#: The brief for `make run`: the demo finishes in under 30 s on a 2-core machine.
DEMO_TIME_LIMIT = 30.0
#: After Ctrl-C: each worker may take its grace and then closing its control consumer (the
#: demo kills one after 25 s), so this bounds the stop, not the demo's speed.
STOP_TIME_LIMIT = 40.0

pytestmark = pytest.mark.integration


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONIOENCODING="utf-8", NO_COLOR="1", PYTHONUNBUFFERED="1")
    # Each run its own store: one kept in the shared temporary folder may come from another
    # flowengine version.
    env["FLOWENGINE_DEMO_STORE"] = f"sqlite:///{tempfile.mkdtemp(dir=_STORES.name)}/demo.db"
    env.pop("FORCE_COLOR", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(script: str, timeout: float = 60.0) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, encoding="utf-8", timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"{script} exited with {proc.returncode}\n--- stdout\n{proc.stdout}\n"
        f"--- stderr\n{proc.stderr}"
    )
    return proc.stdout


def _lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines()]


def assert_in_order(output: str, patterns: list[str]) -> None:
    """Each regex matches a whole line (stripped) somewhere after the previous match."""
    lines = _lines(output)
    position = 0
    for pattern in patterns:
        for index in range(position, len(lines)):
            if re.fullmatch(pattern, lines[index]):
                position = index + 1
                break
        else:
            raise AssertionError(f"no line matching {pattern!r} (in order)\n--- output\n{output}")


def _search(pattern: str, output: str) -> re.Match[str]:
    found = re.search(pattern, output, re.MULTILINE)
    assert found is not None, f"no match for {pattern!r}\n--- output\n{output}"
    return found


def _pids(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"\(pid (\d+)\)", output)]


def _assert_gone(pids: list[int]) -> None:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    assert not alive, f"worker processes {alive} outlived the script"


def _section(output: str, start: str, end: str) -> str:
    return output[output.index(start) : output.index(end)]


def _table_rows(section: str) -> dict[str, list[str]]:
    atoms = ("allocate_ip", "create_volume", "fetch_image", "boot_server", "attach_volume",
             "health_check")  # fmt: skip
    rows = {}
    for line in _lines(section):
        cells = line.split()
        if cells and cells[0] in atoms:
            rows[cells[0]] = cells[1:]
    return rows


def test_demo_workers() -> None:
    output = _run("demo_workers.py", timeout=DEMO_TIME_LIMIT)
    assert_in_order(
        output,
        [
            r"started worker-1 \(pid \d+\), worker-2 \(pid \d+\) on topic 'provisioning';.*",
            r".*1\. provisioning a server on two workers.*",
            r"flow state: SUCCESS \(\d+\.\d+s\)",
            r".*2\. the same flow with a failing health check.*",
            r"engine.run\(\) raised WrappedFailure: ConnectionError: server did not answer on"
            r" port 22",
            r"flow state: REVERTED \(\d+\.\d+s\)",
            r"revert order: .*",
            r".*3\. stopping the workers \(SIGTERM\).*",
            r"worker-1 stopped: exit code 0",
            r"worker-2 stopped: exit code 0",
        ],
    )
    first = _table_rows(_section(output, "1. provisioning", "2. the same flow"))
    assert len(first) == 6 and all(cells[0] == "SUCCESS" for cells in first.values()), first
    ran_on = {cells[2] for cells in first.values()}
    # Three steps are ready at once and each worker holds at most two: both must take part.
    assert ran_on == {"worker-1", "worker-2"}, first
    second = _table_rows(_section(output, "2. the same flow", "revert order:"))
    assert all(cells[0] == "REVERTED" for cells in second.values()), second

    order = next(line for line in _lines(output) if line.startswith("revert order:"))
    reverted = order.removeprefix("revert order:").strip().split(" -> ")
    # Dependents are undone before what they depend on; independent steps in any order.
    assert reverted[:3] == ["health_check", "attach_volume", "boot_server"], reverted
    assert sorted(reverted[3:]) == ["allocate_ip", "create_volume", "fetch_image"], reverted
    _assert_gone(_pids(output))
    # The command it suggests runs from here, with or without the venv on PATH (make run).
    hint = next(line for line in _lines(output) if line.startswith("see both runs"))
    program = hint.split(": ", 1)[1].split()[0]
    assert shutil.which(program) or (EXAMPLES.parent / program).is_file(), hint


def test_demo_workers_ctrl_c_stops_the_workers() -> None:
    def _as_a_terminal_job() -> None:
        os.setpgrp()  # one process group, as a shell job: Ctrl-C reaches every process in it
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "demo_workers.py")],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        encoding="utf-8", preexec_fn=_as_a_terminal_job,
    )  # fmt: skip
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "provisioning a server on two workers" in line:
                break
        else:
            pytest.fail("the demo ended before running the flow:\n" + "".join(seen))
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        rest, _ = proc.communicate(timeout=STOP_TIME_LIMIT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = "".join(seen) + rest
    assert proc.returncode == 130, output
    assert_in_order(
        output,
        [r"worker-1 stopped: exit code 0", r"worker-2 stopped: exit code 0", r"interrupted"],
    )
    _assert_gone(_pids(output))


def test_wbe_linear() -> None:
    output = _run("wbe_linear.py")
    assert_in_order(
        output,
        [
            r"worker serves: wbe_tasks.ChargeCard, wbe_tasks.ReserveStock, wbe_tasks.ShipOrder",
            r"reserve_stock: reserving 2 x widget",
            r"charge_card: charging 19.98 for rsv-widget-2",
            r"ship_order: shipping rsv-widget-2 \(paid, rcpt-rsv-widget-2\)",
            r"result tracking: trk-rsv-widget-2",
            r"flow state: SUCCESS",
            r"worker stopped: True",
        ],
    )


def test_wbe_cells() -> None:
    output = _run("wbe_cells.py")
    assert_in_order(output, [r"engine of cell1: SUCCESS, tasks run in cell1=6, cell2=0",
                             r"engine of cell2: SUCCESS, tasks run in cell1=0, cell2=6"])


def test_wbe_signed() -> None:
    output = _run("wbe_signed.py")
    assert_in_order(output, [r"reserve_stock: reserving 2 x widget",
                             r"with the key: SUCCESS, reservation rsv-widget-2",
                             r"without the key: RequestTimeout"])
    assert re.search(r"Refused NOTIFY message from .*: reason=unsigned", output)
    assert re.search(r"Refused NOTIFY message from .*: reason=unexpected-signature", output)


def test_wbe_fanout() -> None:
    output = _run("wbe_fanout.py")
    assert_in_order(
        output,
        [
            r"3 workers are up on topic 'primes'",
            r"chunk-0\s+0-49999\s+5133\s+worker-\d\s+\d+\.\d+s",
            r"chunk-7\s+350000-399999\s+3883\s+worker-\d\s+\d+\.\d+s",
            r"total: 33860 primes below 400,000",
            r"worker-1 stopped: exit code 0",
            r"worker-2 stopped: exit code 0",
            r"worker-3 stopped: exit code 0",
        ],
    )
    used = int(_search(r"^workers used: (\d)$", output).group(1))
    assert used >= 2, "one worker ran every chunk: the fan-out did not spread"


def test_wbe_progress() -> None:
    output = _run("wbe_progress.py")
    assert_in_order(
        output,
        [
            r"engine pid \d+; worker pid \d+",
            *(rf"progress copy_file: +{p}% \[#*\s*\] \+\d+\.\d+s" for p in (0, 20, 40, 60, 80)),
            r"progress copy_file: 100% \[#{20}\] \+\d+\.\d+s",
            r"copied 64 MB in pid \d+",
            r"stored progress of copy_file: 1.0",
            r"flow state: SUCCESS",
            r"worker-1 stopped: exit code 0",
        ],
    )
    engine_pid, worker_pid = _search(r"engine pid (\d+); worker pid (\d+)", output).groups()
    assert f"copied 64 MB in pid {worker_pid}" in output, "the task did not run in the worker"
    assert engine_pid != worker_pid


def test_tracing() -> None:
    output = _run("tracing.py")
    tree = [r"started worker-1 \(pid \d+\), worker-2 \(pid \d+\)", r"flow state: SUCCESS",
            r"11 spans from 3 processes",
            # A linear flow's tasks may all go to one worker.
            r"trace [0-9a-f]{32} \((3 processes: service, worker-1, worker-2|"
            r"2 processes: service, worker-[12])\)",
            r"POST /orders \[service\] .*",
            r"flow place-order \[service\] .* outcome=SUCCESS"]
    for atom in ("reserve_stock", "charge_card", "ship_order"):
        tree += [rf"execute {atom} \[service\] .* outcome=SUCCESS",
                 rf"send {atom} \[service\] .* attempt=1 outcome=SUCCESS",
                 rf"run {atom} \[worker-[12]\] .* attempt=1 outcome=SUCCESS queued=.*"]
    assert_in_order(output, tree)
    # One tree: each span is indented one step deeper than its parent.
    depths = {line.split()[0] + " " + line.split()[1]: len(line) - len(line.lstrip())
              for line in output.splitlines() if line.startswith("  ")}
    assert depths["flow place-order"] == depths["POST /orders"] + 2
    assert depths["run ship_order"] == depths["send ship_order"] + 2 == depths[
        "execute ship_order"] + 4 == depths["flow place-order"] + 6
    _assert_gone(_pids(output))


def test_wbe_dead_letters() -> None:
    output = _run("wbe_dead_letters.py")
    assert_in_order(output, [
        r"provision: reverted",
        r"flow: REVERTED \(WorkerLost\)",
        r"dead letter: task provision, reason: Task 'provision' lost its worker on each of 1.*",
        r"secret arguments removed: api_token",
        r"expires: \S+ \(parked \S+\)",
        r"requeue allowed: False: Refused: its flow 'provision-server' \(.*\) is REVERTED: it "
        r"has finished.*Nor can it be forced: its secret argument\(s\) 'api_token' were "
        r"removed when it was parked\.",
        r"sent as it is\? no: .*secret argument\(s\) .*",
        r"still parked: True",
    ])
    assert "tok-3f9a" not in output
def test_wbe_async() -> None:
    output = _run("wbe_async.py")
    assert_in_order(
        output,
        [
            r"engine pid \d+; one worker, pid (\d+), one thread",
            r"100 pages of 0.5 s each fetched in \d+\.\d s \(one after the other: 50 s\), "
            r"all in pid \d+",
            r"the hanging call failed: Task 'call' exceeded its time limit of 1s \(ran .*\)",
            r"reserve: REVERTED, revert result 'released slot-7'",
            r"flow state: REVERTED",
            r"worker-1 stopped: exit code 0",
        ],
    )
    worker_pid = _search(r"one worker, pid (\d+), one thread", output).group(1)
    assert f"all in pid {worker_pid}" in output, "the pages did not all run in the one worker"
