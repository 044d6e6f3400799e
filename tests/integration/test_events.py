"""The event stream, ``flowengine events``/``workers`` and the metrics endpoint, on real workers.

Flows run on the worker-based engine against real workers: a :class:`Worker` thread over
kombu's in-process ``memory`` transport, and ``flowengine worker`` processes over Redis and
RabbitMQ. Nothing
sleeps to synchronise: receivers say when they listen, and tests wait for the events they need.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import event_tasks
import pytest
from click.testing import CliRunner
from event_collector import Collector
from wbe_harness import Broker, WorkerFleet, require_broker, subprocess_env, unique_exchange

from flowengine import engines
from flowengine.cli.main import cli
from flowengine.exceptions import WrappedFailure
from flowengine.flows import linear_flow
from flowengine.worker_based.events import EventReceiver
from flowengine.worker_based.worker import Worker

pytestmark = pytest.mark.integration

WAIT = 30.0
TOPIC = "events"
ADD = "event_tasks.Add"
#: Every event of one two-task flow that succeeds, by type.
FLOW_OF_TWO = {"flow-started": 1, "task-sent": 2, "task-received": 2, "task-started": 2,
               "task-succeeded": 2, "flow-succeeded": 1}


class Setup:
    """One broker, one exchange and one serving worker; knows how engines reach them."""

    def __init__(self, broker: dict[str, Any], exchange: str, worker_pid: int,
                 worker_id: str | None = None) -> None:
        self.broker, self.exchange = broker, exchange
        self.worker_pid, self.worker_id = worker_pid, worker_id

    def load(self, flow: Any, **options: Any) -> Any:
        return engines.load(flow, engine="worker-based", exchange=self.exchange,
                            topics=[TOPIC], transition_timeout=WAIT, **self.broker, **options)

    def receiver(self, **filters: Any) -> EventReceiver:
        return EventReceiver(self.exchange, **self.broker, **filters)

    def cli_args(self) -> list[str]:
        if "url" in self.broker:
            return ["--url", self.broker["url"], "--exchange", self.exchange]
        return ["--transport", self.broker["transport"], "--exchange", self.exchange]


@pytest.fixture(scope="module")
def memory_setup() -> Iterator[Setup]:
    exchange = unique_exchange("events-mem")
    worker = Worker(exchange, TOPIC, [event_tasks], threads_count=4, transport="memory",
                    heartbeat_interval=0.1)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    assert worker.wait(WAIT)
    try:
        yield Setup({"transport": "memory"}, exchange, os.getpid(), worker.worker_id)
    finally:
        worker.stop(grace=5.0)
        thread.join(WAIT)


def _fleet_setup(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    broker = require_broker(name)
    fleet = WorkerFleet(broker, unique_exchange(f"events-{name}"), tmp_path_factory.mktemp("w"))
    try:
        (process,) = fleet.start(TOPIC, ["event_tasks"], threads=4)
        yield Setup({"url": broker.url}, fleet.exchange, process.pid)
    finally:
        fleet.stop_all()


@pytest.fixture(scope="module")
def redis_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    yield from _fleet_setup("redis", tmp_path_factory)


@pytest.fixture(scope="module")
def rabbitmq_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    yield from _fleet_setup("rabbitmq", tmp_path_factory)


@pytest.fixture(scope="module")
def beanstalk_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    yield from _fleet_setup("beanstalk", tmp_path_factory)


@pytest.fixture(params=["memory", "redis", "rabbitmq", "beanstalk"])
def setup(request: pytest.FixtureRequest) -> Setup:
    return request.getfixturevalue(f"{request.param}_setup")


def _of_flow(events: list[dict[str, Any]], flow_uuid: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("flow_uuid") == flow_uuid]


def _has(event_type: str, flow_uuid: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda events: any(e["type"] == event_type for e in _of_flow(events, flow_uuid))


def _counts(events: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in events:
        counts[event["type"]] = counts.get(event["type"], 0) + 1
    return counts


def _two_tasks() -> Any:
    return linear_flow.Flow("two").add(event_tasks.Add("a", provides="y"),
                                       event_tasks.Add("b", rebind={"x": "y"}, provides="z"))


def test_a_flow_is_reported_in_order(setup: Setup) -> None:
    collector = Collector(setup.receiver())
    try:
        engine = setup.load(_two_tasks(), store={"x": 1})
        engine.run()
        flow_uuid = engine.storage.flow_uuid
        # The engine's last event and every worker outcome (two processes' streams interleave).
        events = collector.wait_for(lambda es: _counts(_of_flow(es, flow_uuid)) == FLOW_OF_TWO)
    finally:
        collector.close()
    ours = _of_flow(events, flow_uuid)
    by_request: dict[str, list[dict[str, Any]]] = {}
    for event in ours:
        if event.get("request_id"):
            by_request.setdefault(event["request_id"], []).append(event)
    assert len(by_request) == 2
    for request_events in by_request.values():
        worker_side = sorted((e for e in request_events if e["type"] != "task-sent"),
                             key=lambda e: e["clock"])
        assert [e["type"] for e in worker_side] == ["task-received", "task-started",
                                                    "task-succeeded"]
        assert {e["attempt"] for e in request_events} == {1}
        assert len({(e["hostname"], e["pid"]) for e in worker_side}) == 1
        assert worker_side[-1]["runtime"] >= 0
    engine_side = sorted((e for e in ours if e["type"] in ("flow-started", "task-sent",
                                                           "flow-succeeded")),
                         key=lambda e: e["clock"])
    assert [(e["type"], e.get("task_name")) for e in engine_side] == [
        ("flow-started", None), ("task-sent", "a"), ("task-sent", "b"),
        ("flow-succeeded", None)]
    # Lamport clocks: strictly increasing, per process, in the order events arrive.
    last: dict[tuple[str, int], int] = {}
    for event in events:
        origin = (event["hostname"], event["pid"])
        assert event["clock"] > last.get(origin, 0), (origin, event)
        last[origin] = event["clock"]
    for event in events:
        assert {"hostname", "pid", "clock", "timestamp", "utcoffset"} <= set(event)


def _run_collecting(setup: Setup, flow: Any, until: tuple[str, ...], *, fails: str | None = None,
                    **options: Any) -> tuple[str, list[dict[str, Any]]]:
    """Run ``flow`` (failing with a WrappedFailure matching ``fails``, if given) while reading
    events; return its uuid and the events read until one of each type of ``until`` came."""
    collector = Collector(setup.receiver())
    try:
        engine = setup.load(flow, **options)
        with pytest.raises(WrappedFailure, match=fails) if fails else contextlib.nullcontext():
            engine.run()
        flow_uuid = engine.storage.flow_uuid
        events = collector.wait_for(lambda es: all(_has(t, flow_uuid)(es) for t in until))
    finally:
        collector.close()
    return flow_uuid, events


def test_no_event_carries_a_secret(setup: Setup) -> None:
    flow_uuid, events = _run_collecting(
        setup, linear_flow.Flow("leaky").add(event_tasks.Leaky("leaky")),
        ("flow-reverted", "task-failed"), fails="ValueError",
        store={"password": event_tasks.SECRET})
    text = json.dumps(events)
    assert event_tasks.SECRET not in text and event_tasks.URL_PASSWORD not in text
    failed = next(e for e in _of_flow(events, flow_uuid) if e["type"] == "task-failed")
    assert failed["exc_type"] == "ValueError"
    assert failed["exception"] == "login with *** to redis://svc:***@cache:6379/0 refused"
    assert not any({"arguments", "result", "password"} & set(e) for e in events)


def test_each_progress_update_is_one_task_progress_event(setup: Setup) -> None:
    # The worker's task-succeeded is published before its reply: once it and the flow's end
    # are in, so is anything that could have reported the progress.
    flow_uuid, events = _run_collecting(
        setup, linear_flow.Flow("halfway").add(event_tasks.Halfway("half")),
        ("flow-succeeded", "task-succeeded"))
    ours = _of_flow(events, flow_uuid)
    (progress,) = [e for e in ours if e["type"] == "task-progress"]
    sent = next(e for e in ours if e["type"] == "task-sent")
    assert progress["progress"] == 0.5 and progress["action"] == "execute"
    assert (progress["atom_uuid"], progress["task_name"]) == (sent["atom_uuid"], "half")
    assert (progress["attempt"], progress["worker"]) == (1, sent["worker"])
    started = next(e for e in ours if e["type"] == "flow-started")
    assert (progress["hostname"], progress["pid"]) == (started["hostname"], started["pid"])


def test_events_command_with_count_and_json(memory_setup: Setup) -> None:
    result: list[Any] = []
    args = ["events", *memory_setup.cli_args(), "--json", "--type", "flow-", "--count", "2",
            "--timeout", str(WAIT)]
    reading = threading.Thread(target=lambda: result.append(CliRunner().invoke(cli, args)))
    reading.start()
    # The command listens only once it has started: run flows until it has seen two events.
    deadline = time.monotonic() + WAIT
    while reading.is_alive() and time.monotonic() < deadline:
        memory_setup.load(_two_tasks(), store={"x": 1}).run()
    reading.join(WAIT)
    (outcome,) = result
    assert outcome.exit_code == 0, outcome.output
    events = [json.loads(line) for line in outcome.stdout.splitlines()]
    assert len(events) == 2
    assert {e["type"] for e in events} <= {"flow-started", "flow-succeeded"}


def _flowengine() -> str:
    found = shutil.which("flowengine", path=str(Path(sys.executable).parent))
    assert found, "the flowengine console script is not installed in this environment"
    return found


def test_events_command_as_a_process(redis_setup: Setup) -> None:
    engine = redis_setup.load(_two_tasks(), store={"x": 1})
    flow_uuid = engine.storage.flow_uuid
    total = sum(FLOW_OF_TWO.values())
    proc = subprocess.Popen(
        [_flowengine(), "events", *redis_setup.cli_args(), "--json", "--flow", flow_uuid,
         "--count", str(total), "--timeout", str(WAIT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        assert proc.stderr is not None
        assert "listening on redis://" in proc.stderr.readline()
        engine.run()
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert _counts(events) == FLOW_OF_TWO
    assert {e["flow_uuid"] for e in events} == {flow_uuid}


def test_a_process_publishes_its_queued_events_as_it_exits(redis_setup: Setup) -> None:
    # The process's broker client owns the outbox and closes at exit, publishing what it holds
    # first: an event emitted just before the interpreter ends still arrives.
    program = ("import sys\n"
               "from flowengine.worker_based.events import EventPublisher\n"
               "EventPublisher(sys.argv[1], url=sys.argv[2]).emit('task-sent', last=True)\n"
               "import os; print(os.getpid())\n")
    collector = Collector(redis_setup.receiver(types=["task-sent"]))
    try:
        done = subprocess.run([sys.executable, "-c", program, redis_setup.exchange,
                               redis_setup.broker["url"]],
                              capture_output=True, text=True, env=subprocess_env(),
                              timeout=WAIT)
        assert done.returncode == 0, done.stderr
        (event,) = collector.wait_for(lambda events: len(events) >= 1)
    finally:
        collector.close()
    assert event["last"] is True and event["pid"] == int(done.stdout)


def test_events_command_leaves_heartbeats_out_unless_asked(memory_setup: Setup) -> None:
    # The worker sends a heartbeat every 0.1s: both commands listen for the same second.
    runs: dict[str, Any] = {}
    commands = {"default": ["--timeout", "1"],
                "asked": ["--heartbeats", "--count", "3", "--timeout", str(WAIT)]}
    readers = [threading.Thread(target=lambda name=name, extra=extra: runs.__setitem__(
        name, CliRunner().invoke(cli, ["events", *memory_setup.cli_args(), "--json", *extra])))
        for name, extra in commands.items()]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(WAIT + 5)
    asked = [json.loads(line) for line in runs["asked"].stdout.splitlines()]
    assert runs["asked"].exit_code == 0, runs["asked"].output
    assert [e["type"] for e in asked] == ["worker-heartbeat"] * 3
    assert runs["default"].exit_code == 2  # nothing printed before the timeout
    assert "timeout: 0 event(s)" in runs["default"].stderr
    by_type = CliRunner().invoke(cli, ["events", *memory_setup.cli_args(), "--json", "--type",
                                       "worker-heartbeat", "--count", "1", "--timeout", str(WAIT)])
    assert by_type.exit_code == 0, by_type.output


def test_events_command_times_out_with_exit_2(memory_setup: Setup) -> None:
    outcome = CliRunner().invoke(cli, ["events", "--transport", "memory", "--exchange",
                                       unique_exchange("silent"), "--timeout", "0.2"])
    assert outcome.exit_code == 2
    assert "timeout: 0 event(s)" in outcome.stderr


def test_workers_command_lists_a_live_worker(memory_setup: Setup) -> None:
    outcome = CliRunner().invoke(cli, ["workers", *memory_setup.cli_args(), "--json",
                                       "--wait", "1"])
    assert outcome.exit_code == 0, outcome.output
    (row,) = [json.loads(line) for line in outcome.stdout.splitlines()]
    assert row["worker"] == memory_setup.worker_id
    assert row["topics"] == [TOPIC]
    assert set(row["tasks"]) == {f"event_tasks.{name}" for name in (
        "Add", "Leaky", "Halfway", "Fail", "BadRevert")}
    assert (row["capacity"], row["free"], row["in_flight"], row["prefetch"]) == (4, 4, 0, 4)
    assert time.time() - row["last_heartbeat"] < WAIT
    table = CliRunner().invoke(cli, ["workers", *memory_setup.cli_args(), "--wait", "1"])
    header, line = table.stdout.splitlines()
    assert header.split()[3:8] == ["VERSIONS", "CAPACITY", "FREE", "IN-FLIGHT", "PREFETCH"]
    assert line.split()[3:8] == ["1.0", "4", "4", "0", "4"]
    assert set(row["versions"].values()) == {"1.0"}


def test_workers_command_as_a_process(redis_setup: Setup) -> None:
    proc = subprocess.run([_flowengine(), "workers", *redis_setup.cli_args(), "--json"],
                          capture_output=True, text=True, env=subprocess_env(), timeout=WAIT)
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert row["worker"].split(":")[1] == str(redis_setup.worker_pid)  # host:pid:random
    assert row["pid"] == redis_setup.worker_pid
    assert (row["topics"], row["capacity"], row["in_flight"]) == ([TOPIC], 4, 0)


def test_workers_command_asks_topics_with_notify() -> None:
    exchange = unique_exchange("notify")
    worker = Worker(exchange, "quiet", [event_tasks.Add], threads_count=3, transport="memory",
                    events=False)  # only NOTIFY can find it
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    assert worker.wait(WAIT)
    try:
        base = ["workers", "--transport", "memory", "--exchange", exchange, "--json",
                "--wait", "0.5"]
        silent = CliRunner().invoke(cli, base)
        asked = CliRunner().invoke(cli, [*base, "--topic", "quiet"])
    finally:
        worker.stop(grace=5.0)
        thread.join(WAIT)
    assert silent.exit_code == 2 and silent.stdout == ""
    assert "no live workers heard from" in silent.stderr
    assert asked.exit_code == 0, asked.output
    (row,) = [json.loads(line) for line in asked.stdout.splitlines()]
    assert (row["worker"], row["topics"], row["free"]) == (worker.worker_id, ["quiet"], 3)
    assert row["tasks"] == ["event_tasks.Add"] and row["source"] == ["notify"]


# -- metrics ------------------------------------------------------------------------------------


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_worker_metrics_endpoint_over_redis(tmp_path: Path, exchange: str) -> None:
    importlib.import_module("prometheus_client")  # a test dependency
    broker: Broker = require_broker("redis")
    port = _free_port()
    fleet = WorkerFleet(broker, exchange, tmp_path)
    try:
        fleet.start(TOPIC, ["event_tasks"], threads=2, extra_args=["--metrics-port", str(port)])
        setup = Setup({"url": broker.url}, exchange, 0)
        setup.load(_two_tasks(), store={"x": 1}).run()
        with pytest.raises(WrappedFailure, match="ValueError"):
            setup.load(linear_flow.Flow("leaky").add(event_tasks.Leaky("leaky")),
                       store={"password": event_tasks.SECRET}).run()
        samples = _scrape(port)
    finally:
        fleet.stop_all()
    worker = {"role": "worker"}
    assert _sample(samples, "flowengine_atom_outcomes_total", **worker, task="a",
                   state="SUCCESS") == 1
    assert _sample(samples, "flowengine_atom_outcomes_total", **worker, task="leaky",
                   state="FAILURE") == 1
    # The failed task was reverted on the worker too: a revert, not a second execute.
    assert _sample(samples, "flowengine_atom_outcomes_total", **worker, task="leaky",
                   state="REVERTED") == 1
    assert _sample(samples, "flowengine_atom_outcomes_total", **worker, task="leaky",
                   state="SUCCESS") == 0
    assert _sample(samples, "flowengine_atom_duration_seconds_count", **worker, task="b",
                   action="execute") == 1
    assert _sample(samples, "flowengine_atoms_in_flight", **worker) == 0


def test_engine_and_worker_metrics_in_one_process() -> None:
    importlib.import_module("prometheus_client")  # a test dependency
    port = _free_port()
    exchange = unique_exchange("metrics")
    worker = Worker(exchange, TOPIC, [event_tasks], threads_count=2, transport="memory",
                    metrics=True)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    assert worker.wait(WAIT)
    setup = Setup({"transport": "memory"}, exchange, os.getpid(), worker.worker_id)
    undone = linear_flow.Flow("undone").add(event_tasks.BadRevert("undo"),
                                            event_tasks.Fail("boom"))
    # The engine serves the endpoint itself (option metrics_port) from when it runs; later
    # engines of the process asking for the same port share it.
    first = setup.load(_two_tasks(), store={"x": 1}, metrics_port=port)
    try:
        first.run()
        before = _scrape(port)
        setup.load(_two_tasks(), store={"x": 1}, metrics_port=port).run()
        with pytest.raises((WrappedFailure, RuntimeError), match="cannot"):
            setup.load(undone, metrics_port=port).run()
        after = _scrape(port)
    finally:
        worker.stop(grace=5.0)
        thread.join(WAIT)
        if first.metrics_server is not None:
            first.metrics_server.shutdown()

    def delta(name: str, **labels: str) -> float:
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    for role in ("engine", "worker"):
        assert delta("flowengine_atom_outcomes_total", role=role, task="a", state="SUCCESS") == 1
        assert delta("flowengine_atom_duration_seconds_count", role=role, task="b",
                     action="execute") == 1
        assert _sample(after, "flowengine_atoms_in_flight", role=role) == 0
        # Reverts count as reverts on both sides, whether they worked or failed.
        assert delta("flowengine_atom_outcomes_total", role=role, task="boom",
                     state="REVERTED") == 1
        assert delta("flowengine_atom_outcomes_total", role=role, task="undo",
                     state="REVERT_FAILURE") == 1
        assert delta("flowengine_atom_outcomes_total", role=role, task="undo",
                     state="FAILURE") == 0
    assert delta("flowengine_atom_outcomes_total", role="worker", task="undo",
                 state="SUCCESS") == 1  # its execute, and only that
    assert delta("flowengine_flows_total", state="SUCCESS") == 1
    assert delta("flowengine_flows_total", state="FAILURE") == 1


def test_commands_exit_1_when_the_broker_cannot_be_reached() -> None:
    for command, what in ((["events", "--timeout", "5"], "read events from"),
                          (["workers", "--wait", "5"], "read events from"),
                          (["dead-letters", "list"], "reach the dead letters of"),
                          (["dead-letters", "requeue", "x"], "reach the dead letters of")):
        outcome = CliRunner().invoke(cli, [*command, "--url", "redis://:pw@127.0.0.1:1/0"])
        assert outcome.exit_code == 1, (command, outcome.output)
        assert f"error: cannot {what} redis://:***@127.0.0.1:1/0" in outcome.stderr
        assert "pw@" not in outcome.output and "Traceback" not in outcome.output


def test_the_events_example() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "events_stream.py"
    proc = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=WAIT)
    assert proc.returncode == 0, proc.stderr
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    assert lines[0] == "flow failed as planned: WrappedFailure"
    assert "worker task-failed charge execute card *** declined for hold-12" in lines
    assert "engine task-progress reserve execute 50%" in lines
    assert lines[-1] == "engine flow-reverted card *** declined for hold-12"
    assert "4111111111111111" not in proc.stdout
