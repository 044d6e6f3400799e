"""A broker nobody answers: a worker says so at every attempt, an engine gives up naming it.

Real ``flowengine worker`` and ``flowengine run`` processes against 127.0.0.1 on a free port
nothing listens on. A worker logs each failed attempt (masked URL, reason, next try) and says it
is connected only once a broker (a private Redis started on that port) answers; ``run`` and
``engines.run`` fail after ``connect_timeout`` naming the broker, password masked.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_lines import read_lines, wait_for_line  # tests/ is on sys.path (rootdir conftest)
from private_redis import PrivateRedis, free_port

from flowengine import engines
from flowengine.flows import linear_flow
from flowengine.worker_based import backoff as bo

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a process gets to show a line, or to exit.
WAIT = 60.0
SECRET = "n0t-for-logs"
TASKS = """
    from flowengine import task
    from flowengine.flows import linear_flow

    class Hello(task.Task):
        def execute(self):
            return "hello"

    def make_flow():
        return linear_flow.Flow("f").add(Hello("hello"))
"""

Spawn = Callable[..., tuple[subprocess.Popen[str], queue.Queue[str]]]


@pytest.fixture
def flowengine_cli(tmp_path: Path) -> Iterator[Spawn]:
    """Starts ``flowengine ARGS...`` in ``tmp_path`` (which holds module ``hello_tasks``)."""
    (tmp_path / "hello_tasks.py").write_text(textwrap.dedent(TASKS))
    started: list[subprocess.Popen[str]] = []

    def spawn(*args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWENGINE_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        proc = subprocess.Popen([sys.executable, "-m", "flowengine.cli.main", *args],
                                cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(proc)
        return proc, read_lines(proc)

    try:
        yield spawn
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_a_worker_reports_every_failed_attempt_and_never_claims_to_be_connected(
        flowengine_cli: Spawn) -> None:
    port = free_port()
    proc, lines = flowengine_cli("worker", "--no-events", "--url",
                                 f"amqp://guest:{SECRET}@127.0.0.1:{port}//", "--exchange", "x",
                                 "--topic", "t", "--task", "hello_tasks")
    seen = wait_for_line(lines, "queue x_t) on amqp://guest:***@127.0.0.1:"
                         f"{port}// exchange 'x' failed (attempt 4)", WAIT)
    attempts = [line for line in seen if "Connecting (queue x_t)" in line]
    assert len(attempts) == 4, seen  # each one, not the first few only
    for number, line in enumerate(attempts, 1):
        assert re.search(rf"failed \(attempt {number}\): ConnectionRefusedError: .*refused; "
                         r"retrying in \d+\.\d\ds$", line), line
    assert not [line for line in seen if "onnected to" in line or "onsuming" in line], seen
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT) == 0
    everything = "\n".join(seen + list(lines.queue))
    assert SECRET not in everything and "Traceback" not in everything


def test_a_worker_says_it_is_connected_once_the_broker_answers(
        flowengine_cli: Spawn, tmp_path: Path) -> None:
    redis = PrivateRedis(tmp_path / "redis")
    proc, lines = flowengine_cli("worker", "--no-events", "--url", redis.url, "--exchange", "x",
                                 "--topic", "t", "--task", "hello_tasks")
    before = wait_for_line(lines, "queue x_t) on redis://127.0.0.1:"
                           f"{redis.port}/0 exchange 'x' failed (attempt 2)", WAIT)
    assert not [line for line in before if "Connected to" in line], before
    redis.start()
    try:
        wait_for_line(lines, f"Connected to redis://127.0.0.1:{redis.port}/0 exchange 'x': "
                      "consuming queue x_t", WAIT)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
    finally:
        redis.stop(keep_data=False)


def test_run_fails_after_its_connect_timeout_naming_the_unreachable_broker(
        flowengine_cli: Spawn) -> None:
    port = free_port()
    proc, lines = flowengine_cli("run", "hello_tasks:make_flow", "--engine",
                                 "worker-based://?connect_timeout=3", "--url",
                                 f"amqp://guest:{SECRET}@127.0.0.1:{port}//", "--topic", "t")
    assert proc.wait(WAIT) == 1
    output = list(lines.queue)
    retries = [line for line in output if "failed (attempt" in line]
    assert retries and all(f"amqp://guest:***@127.0.0.1:{port}//" in line for line in retries)
    [error] = [line for line in output if line.startswith("error:")]
    assert re.fullmatch(
        rf"error: BrokerUnreachable: The broker amqp://guest:\*\*\*@127\.0\.0\.1:{port}// is "
        r"unreachable: no connection within 3s \(\d+ failed attempt\(s\); the last attempt "
        r"failed with ConnectionRefusedError: .*refused\)", error), error
    everything = "\n".join(output)
    assert SECRET not in everything and "Traceback" not in everything


def test_engines_run_raises_broker_unreachable_naming_the_broker() -> None:
    port = free_port()
    flow = linear_flow.Flow("f").add(linear_flow.Flow("empty"))
    with pytest.raises(bo.BrokerUnreachable,
                       match=rf"The broker redis://:\*\*\*@127\.0\.0\.1:{port}/0 is unreachable: "
                             r"no connection within 0\.5s") as raised:
        engines.run(flow, engine="worker-based", url=f"redis://:{SECRET}@127.0.0.1:{port}/0",
                    topics=["t"], connect_timeout=0.5)
    assert SECRET not in str(raised.value)
