"""``flowengine worker``: its options, the task specs it serves, and how it refuses to start.

Task modules are written per test under ``tmp_path`` with unique names. Start-up errors are
checked in-process (the command exits before serving); a worker that must serve, or must exit
on its own, runs as a real process, read until the line that says it is consuming.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import textwrap
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from cli_lines import read_lines, wait_for_line  # tests/ is on sys.path (rootdir conftest)
from click.testing import CliRunner, Result

from flowengine import engines
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.main import cli
from flowengine.flows import linear_flow
from flowengine.worker_based import worker as wk

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a worker process gets to start serving, or to give up on its own.
PROCESS_TIMEOUT = 30.0
CONSUMING = "consuming queue"


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str | None]:
    """The developer's FLOWENGINE_* variables unset, then ``extra``."""
    env: dict[str, str | None] = {key: None for key in os.environ
                                  if key.startswith("FLOWENGINE_")}
    env.update(extra or {})
    return env


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=clean_env(env))


@pytest.fixture
def task_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """Writes a module into an importable folder (also the current one); returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)

    def write(source: str) -> str:
        name = f"tasks_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


ECHO = """
    from flowengine import task

    class Echo(task.Task):
        def execute(self, x):
            return x
"""


# ---- --transport-option: whole on the command line, split only in the environment -------------


@click.command()
@broker_options
def show_transport_options(**broker: Any) -> None:
    click.echo(json.dumps(broker_kwargs(**broker)["transport_options"]))


def transport_options(*args: str, env: dict[str, str] | None = None) -> Any:
    result = CliRunner().invoke(show_transport_options, list(args), env=clean_env(env))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_each_command_line_transport_option_is_taken_whole() -> None:
    given = ["data_folder=/tmp/a b/queues", "priority_steps=[0, 3, 6,9]",
             'sentinel_kwargs={"password": "p w", "ssl": true}']
    found = transport_options(*[arg for item in given for arg in ("--transport-option", item)])
    assert found == {"data_folder": "/tmp/a b/queues", "priority_steps": [0, 3, 6, 9],
                     "sentinel_kwargs": {"password": "p w", "ssl": True}}


def test_the_environment_variable_holds_several_split_on_commas_and_spaces() -> None:
    found = transport_options(env={
        "FLOWENGINE_TRANSPORT_OPTION": "polling_interval=0.5,fsync=true  data_folder=/q"})
    assert found == {"polling_interval": 0.5, "fsync": True, "data_folder": "/q"}


def test_an_option_without_a_key_is_named() -> None:
    result = invoke("worker", "--transport", "memory", "--topic", "t", "--task", "x",
                    "--transport-option", "data folder")
    assert result.exit_code == 2
    assert "transport option 'data folder' is not of the form key=value" in result.output


def test_async_concurrency_reaches_the_worker_and_zero_is_a_usage_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke("worker", "--transport", "memory", "--topic", "t", "--task", "x",
                    "--async-concurrency", "0")
    assert result.exit_code == 2 and "--async-concurrency" in result.output
    built: dict[str, Any] = {}

    def fake_worker(**kwargs: Any) -> Any:
        built.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(wk, "Worker", fake_worker)
    monkeypatch.setattr("flowengine.cli.worker.check_task_specs", lambda specs: list(specs))
    result = invoke("worker", "--transport", "memory", "--topic", "t", "--task", "x",
                    "--async-concurrency", "50")
    assert built["async_concurrency"] == 50, result.output


@pytest.fixture
def run_worker(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[str],
                                                               queue.Queue[str]]]]:
    """Starts ``flowengine worker ARGS...`` processes (output: one line queue); kills leftovers."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWENGINE_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowengine.cli.main", "worker", "--no-events", *args],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)  # fmt: skip
        started.append(proc)
        return proc, read_lines(proc)

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_a_worker_serves_from_a_data_folder_whose_path_has_a_space(
    tmp_path: Path, task_modules: Callable[[str], str], run_worker: Callable[..., Any],
) -> None:  # fmt: skip
    module = task_modules(ECHO)
    folder = tmp_path / "a b" / "queues"
    exchange = f"spaced-{uuid.uuid4().hex[:8]}"
    proc, lines = run_worker("--transport", "flowengine-fs", "--transport-option",
                             f"data_folder={folder}", "--exchange", exchange, "--topic", "t",
                             "--task", module, "--grace", "1")
    wait_for_line(lines, CONSUMING, PROCESS_TIMEOUT)
    echo = __import__(module).Echo
    flow = linear_flow.Flow("spaced").add(echo("echo", provides="y"))
    found = engines.run(flow, store={"x": "through a b"}, engine="worker-based",
                        exchange=exchange, topics=["t"], transport="flowengine-fs",
                        transport_options={"data_folder": str(folder)}, transition_timeout=10)
    assert found["y"] == "through a b"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(PROCESS_TIMEOUT) == 0
    wait_for_line(lines, "(topic 't') stopped", PROCESS_TIMEOUT)  # it says it stopped


BLOCKING = """
    import pathlib
    import threading

    from flowengine import task

    class Block(task.Task):
        def execute(self, started):
            pathlib.Path(started).write_text("started\\n")  # a FIFO the test reads
            threading.Event().wait()  # runs until the process ends
"""

ENGINE = """
import sys
from flowengine import engines
from flowengine.flows import linear_flow
sys.path.insert(0, sys.argv[1])
block = __import__(sys.argv[2]).Block
engines.run(linear_flow.Flow("blocked").add(block("block")), store={"started": sys.argv[3]},
            engine="worker-based", exchange=sys.argv[4], topics=["t"],
            transport="flowengine-fs", transport_options={"data_folder": sys.argv[5]})
"""


def test_a_second_signal_stops_the_worker_at_once(
    tmp_path: Path, task_modules: Callable[[str], str], run_worker: Callable[..., Any],
) -> None:  # fmt: skip
    module = task_modules(BLOCKING)
    folder, started = tmp_path / "queues", tmp_path / "started"
    # The task says it started through a FIFO: the test awaits its line, not a file's existence.
    os.mkfifo(started)
    reader = os.open(started, os.O_RDONLY | os.O_NONBLOCK)
    exchange = f"twice-{uuid.uuid4().hex[:8]}"
    proc, lines = run_worker("--transport", "flowengine-fs", "--transport-option",
                             f"data_folder={folder}", "--exchange", exchange, "--topic", "t",
                             "--task", module, "--grace", "600")
    wait_for_line(lines, CONSUMING, PROCESS_TIMEOUT)
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(tmp_path), module,
                               str(started), exchange, str(folder)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        readable, _, _ = select.select([reader], [], [], PROCESS_TIMEOUT)
        assert readable and os.read(reader, 64) == b"started\n", "the task never started"
        proc.send_signal(signal.SIGINT)
        wait_for_line(lines, "received SIGINT: finishing in-flight work", PROCESS_TIMEOUT)
        proc.send_signal(signal.SIGINT)  # the task never ends: without this, 600 s
        assert proc.wait(PROCESS_TIMEOUT) == 130
        wait_for_line(lines, "received SIGINT again: stopping now", PROCESS_TIMEOUT)
    finally:
        engine.kill()
        engine.wait()
        os.close(reader)


# ---- task specs ---------------------------------------------------------------------------------


def test_a_module_serves_the_task_classes_it_imports_as_taskflow_finds_them(
    task_modules: Callable[[str], str],
) -> None:  # fmt: skip
    defining = task_modules(ECHO)
    reexporting = task_modules(f"""
        from flowengine.task import FunctorTask, MapFunctorTask, Task
        from {defining} import Echo
        from {defining} import Echo as _Hidden
    """)
    echo = __import__(defining).Echo
    # flowengine's own classes are what a module builds on, never what it offers.
    assert wk.find_task_classes(reexporting) == [echo]
    assert wk.find_task_classes([reexporting, defining]) == [echo]


def test_a_worker_with_no_task_class_refuses_to_start(task_modules: Callable[[str], str]) -> None:
    empty = task_modules("""
        from flowengine import task

        VALUE = task.Task
    """)
    with pytest.raises(ValueError, match=f"the task specs \\['{empty}'\\] hold no concrete Task"):
        wk.Worker("ex", "t", [empty], transport="memory", events=False)
    result = invoke("worker", "--transport", "memory", "--topic", "t", "--task", empty)
    assert result.exit_code == 1, result.output
    assert f"the task specs ['{empty}'] hold no concrete Task subclasses" in result.output


@pytest.mark.parametrize(("source", "error"), [
    ("raise RuntimeError('no configuration file')", "RuntimeError: no configuration file"),
    ("def broken(:\n    pass", "SyntaxError: invalid syntax"),
    ("import no_such_module_here", "ModuleNotFoundError: No module named 'no_such_module_here'"),
], ids=["RuntimeError", "SyntaxError", "ImportError"])
def test_a_task_module_that_fails_to_import_is_one_clear_line(
    task_modules: Callable[[str], str], source: str, error: str,
) -> None:  # fmt: skip
    good, bad = task_modules(ECHO), task_modules(source)
    result = invoke("worker", "--transport", "memory", "--topic", "t",
                    env={"FLOWENGINE_TASK": f"{good},{bad}"})
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    assert line.startswith(f"Error: cannot load the tasks of '{bad}': {error}"), line


def test_a_missing_class_is_named(task_modules: Callable[[str], str]) -> None:
    module = task_modules(ECHO)
    result = invoke("worker", "--transport", "memory", "--topic", "t",
                    "--task", f"{module}:Nope")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"Error: cannot load the tasks of '{module}:Nope': ImportError: Task class "
        f"'{module}:Nope' not found"]


# ---- credentials the broker refuses -------------------------------------------------------------

TEST_BROKERS = {
    "rabbitmq": os.environ.get("FLOWENGINE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": os.environ.get("FLOWENGINE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
WRONG_PASSWORD = "not-the-password"


def _broker_problem(url: str) -> str | None:
    import kombu

    try:
        with kombu.Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
            conn.channel().close()
    except Exception as err:  # any driver or network error means "not available"
        return f"{type(err).__name__}: {err}"
    return None


def with_wrong_credentials(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    # Redis has no user but "default" unless ACLs add some: a user it does not know is refused.
    user = parts.username or "nobody"
    netloc = f"{user}:{WRONG_PASSWORD}@{parts.hostname}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.integration
@pytest.mark.parametrize("broker", sorted(TEST_BROKERS))
def test_refused_credentials_stop_the_worker_with_a_masked_message(
    broker: str, local_servers: Any, task_modules: Callable[[str], str],
    run_worker: Callable[..., Any],
) -> None:  # fmt: skip
    url = TEST_BROKERS[broker]
    local_servers.require(f"{broker} test server", lambda: _broker_problem(url))
    proc, lines = run_worker("--url", with_wrong_credentials(url), "--topic", "t",
                             "--task", task_modules(ECHO))
    output = wait_for_line(lines, "Error:", PROCESS_TIMEOUT)
    assert proc.wait(PROCESS_TIMEOUT) == 1, output
    error = output[-1]
    assert "worker on topic 't' was refused by the broker" in error, error
    assert "not retrying" in error, error
    assert f":***@{urllib.parse.urlsplit(url).hostname}" in error, error
    everything = "\n".join(output)
    assert WRONG_PASSWORD not in everything and "Traceback" not in everything


@pytest.mark.integration
def test_a_broker_that_does_not_answer_is_still_retried(run_worker: Callable[..., Any],
                                                        task_modules: Callable[[str], str],
                                                        ) -> None:
    # Port 9 (discard) is closed here: connection refused, which the worker must keep retrying.
    proc, lines = run_worker("--url", "redis://127.0.0.1:9/0", "--topic", "t",
                             "--task", task_modules(ECHO))
    wait_for_line(lines, "failed (attempt 1)", PROCESS_TIMEOUT)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(PROCESS_TIMEOUT) == 0

