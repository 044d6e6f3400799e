"""What engines report: flow and atom events, the atom log, and the Prometheus metrics.

Local engines (serial, parallel) run the flows; the worker-based engine's side is in
``tests/integration/test_events.py``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest

from flowengine import engines, exceptions, states, task
from flowengine.flows import linear_flow
from flowengine.listeners.atoms import LOGGER_NAME, AtomLogListener
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.event_listener import EventListener

ENGINES = ["serial", "parallel"]
SECRET = "s3cr3t-pw"


class Ok(task.Task):
    def execute(self) -> str:
        return "fine"


class Leaky(task.Task):
    """Fails with its secret argument and a broker password in the message."""

    secret_args = ("password",)

    def execute(self, password: str) -> None:
        raise ValueError(f"login with {password} to amqp://svc:{password}@mq:5672// refused")


class Lost(task.Task):
    def execute(self) -> None:
        raise exceptions.WorkerLost(self.name, 3, ["w1", "w2", "w3"])


class Recorder(ext.EventSink):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event_type: str, **fields: object) -> None:
        self.events.append((event_type, dict(fields)))

    def types(self) -> list[str]:
        return [event_type for event_type, _ in self.events]


def _run(engine: Any) -> None:
    try:
        engine.run()
    except Exception:  # the failing flows re-raise; the events are what is checked
        pass


@pytest.mark.parametrize("kind", ENGINES)
def test_a_flow_that_succeeds(kind: str) -> None:
    engine = engines.load(linear_flow.Flow("f").add(Ok("a"), Ok("b")), engine=kind)
    sink = Recorder()
    with EventListener(engine, sink):
        engine.run()
    assert sink.types() == ["flow-started", "task-started", "task-succeeded", "task-started",
                            "task-succeeded", "flow-succeeded"]
    flow_uuid = engine.storage.flow_uuid
    assert all(fields["flow_uuid"] == flow_uuid for _, fields in sink.events)
    started, succeeded = sink.events[1][1], sink.events[2][1]
    assert started["task_name"] == succeeded["task_name"] == "a"
    assert succeeded["runtime"] >= 0 and succeeded["action"] == "execute"
    assert sink.events[-1][1]["duration"] >= succeeded["runtime"]
    assert "result" not in succeeded
    assert (len(engine.notifier), len(engine.atom_notifier)) == (0, 0)


@pytest.mark.parametrize("kind", ENGINES)
def test_a_failing_flow_reports_redacted_failures(kind: str) -> None:
    flow = linear_flow.Flow("f").add(Ok("a"), Leaky("leaky"))
    engine = engines.load(flow, store={"password": SECRET}, engine=kind)
    sink = Recorder()
    with EventListener(engine, sink):
        _run(engine)
    assert sink.types() == ["flow-started", "task-started", "task-succeeded", "task-started",
                            "task-failed", "task-reverted", "task-reverted", "flow-reverted"]
    failed = dict(sink.events)["task-failed"]
    assert failed["exc_type"] == "ValueError"
    assert failed["exception"] == "login with *** to amqp://svc:***@mq:5672// refused"
    assert dict(sink.events)["flow-reverted"]["failed_atoms"] == ["leaky"]
    assert SECRET not in repr(sink.events)


def test_secrets_are_masked_even_in_failures_the_executor_never_redacted() -> None:
    flow = linear_flow.Flow("f").add(Leaky("leaky"))
    engine = engines.load(flow, store={"password": SECRET})
    from flowengine.types.failure import Failure

    try:
        raise ValueError(f"from a TaskFlow worker: {SECRET}")
    except ValueError:
        unredacted = Failure()
    engine.compile()
    engine.prepare()
    sink = Recorder()
    with EventListener(engine, sink) as listener:
        listener._task_receiver(states.FAILURE, {"task_name": "leaky", "task_uuid": "u",
                                                 "old_state": states.RUNNING,
                                                 "result": unredacted})
    assert sink.events[0][1]["exception"] == "from a TaskFlow worker: ***"


def test_remote_mode_leaves_task_outcomes_to_workers() -> None:
    flow = linear_flow.Flow("f").add(Ok("a"), Lost("lost"))
    engine = engines.load(flow)
    sink = Recorder()
    with EventListener(engine, sink, task_events=False):
        _run(engine)
    # The worker reports started/succeeded/failed; a lost worker reports nothing, so the engine
    # does (its failure decided by the engine).
    assert sink.types() == ["flow-started", "task-failed", "task-reverted", "task-reverted",
                            "flow-reverted"]
    failed = sink.events[1][1]
    assert failed["origin"] == "engine" and failed["exc_type"].endswith("WorkerLost")


def test_preparing_a_flow_is_not_reported_as_suspended() -> None:
    engine = engines.load(linear_flow.Flow("f").add(Ok("a")))
    sink = Recorder()
    with EventListener(engine, sink):
        engine.prepare()  # RESUMING -> SUSPENDED, before anything ran
    assert sink.events == []


def test_a_suspended_flow() -> None:
    engine = engines.load(linear_flow.Flow("f").add(Ok("a"), Ok("b")))
    sink = Recorder()
    engine.atom_notifier.register(states.SUCCESS, lambda state, details: engine.suspend())
    with EventListener(engine, sink):
        engine.run()
    assert sink.types() == ["flow-started", "task-started", "task-succeeded", "flow-suspended"]


# -- the atom log -------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Slow(task.Task):
    clock: Clock

    def execute(self) -> None:
        self.clock.now += 1.25


@pytest.mark.parametrize("kind", ENGINES)
def test_every_engine_logs_each_atom_transition(kind: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    engine = engines.load(linear_flow.Flow("f").add(Ok("a"), Ok("b")), engine=kind)
    engine.run()
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    assert [line.split()[:2] for line in lines] == [
        ["atom=a", "state=RUNNING"], ["atom=a", "state=SUCCESS"],
        ["atom=b", "state=RUNNING"], ["atom=b", "state=SUCCESS"]]
    assert all(f"flow_uuid={engine.storage.flow_uuid}" in line for line in lines)
    assert "duration=" in lines[1] and "duration=" not in lines[0]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == LOGGER_NAME)
    assert (len(engine.notifier), len(engine.atom_notifier)) == (0, 0)


def test_atom_log_line_format(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    slow = Slow("slow step")
    slow.clock = clock
    flow = linear_flow.Flow("provision").add(slow, Leaky("leaky"))
    engine = engines.load(flow, store={"password": SECRET})
    log = logging.getLogger("test.atoms")
    caplog.set_level(logging.INFO, logger="test.atoms")
    with AtomLogListener(engine, log=log, clock=clock):
        _run(engine)
    lines = [r.getMessage() for r in caplog.records if r.name == "test.atoms"]
    uuid_of = engine.storage.get_atom_uuid
    assert lines[1] == (
        f'atom="slow step" state=SUCCESS from=RUNNING flow=provision '
        f"flow_uuid={engine.storage.flow_uuid} atom_uuid={uuid_of('slow step')} attempt=1 "
        f"worker=local duration=1.250s")
    failed = next(line for line in lines if "state=FAILURE" in line)
    assert failed.endswith(
        'error="ValueError: login with *** to amqp://svc:***@mq:5672// refused"')
    assert SECRET not in "\n".join(lines)
    record = next(r for r in caplog.records if "state=SUCCESS" in r.getMessage())
    assert (record.atom, record.duration, record.worker) == ("slow step", 1.25, "local")


def test_the_library_never_configures_logging() -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    engines.load(linear_flow.Flow("f").add(Ok("a"))).run()
    assert (root.handlers, root.level) == (handlers, level)
    assert logging.getLogger(LOGGER_NAME).handlers == []


# -- metrics ------------------------------------------------------------------------------------


@pytest.fixture
def registry() -> Any:
    prometheus_client = pytest.importorskip("prometheus_client")
    return prometheus_client.CollectorRegistry()


def test_metrics_sink_counts_what_the_events_say(registry: Any) -> None:
    from flowengine.worker_based.metrics import MetricsSink

    sink = MetricsSink(role="worker", registry=registry)
    value = registry.get_sample_value
    sink.emit("task-started", task_name="a")
    assert value("flowengine_atoms_in_flight", {"role": "worker"}) == 1
    sink.emit("task-succeeded", task_name="a", runtime=0.25, action="execute")
    sink.emit("task-started", task_name="b")
    sink.emit("task-failed", task_name="b", runtime=2.0, exc_type="ValueError")
    sink.emit("task-lost", task_name="c")
    sink.emit("task-failed", task_name="c", exc_type="flowengine.exceptions.WorkerLost",
              origin="engine")
    sink.emit("flow-succeeded")
    assert value("flowengine_atoms_in_flight", {"role": "worker"}) == 0
    assert value("flowengine_atom_outcomes_total",
                 {"role": "worker", "task": "a", "state": "SUCCESS"}) == 1
    assert value("flowengine_atom_outcomes_total",
                 {"role": "worker", "task": "b", "state": "FAILURE"}) == 1
    assert value("flowengine_atom_duration_seconds_count",
                 {"role": "worker", "task": "b", "action": "execute"}) == 1
    assert value("flowengine_atom_duration_seconds_sum",
                 {"role": "worker", "task": "a", "action": "execute"}) == 0.25
    assert value("flowengine_leases_lapsed_total", {"role": "worker", "task": "c"}) == 1
    assert value("flowengine_dead_letters_total", {"role": "worker", "task": "c"}) == 1
    assert value("flowengine_flows_total", {"state": "SUCCESS"}) == 1


def test_engine_metrics_through_the_event_listener(registry: Any) -> None:
    from flowengine.worker_based.metrics import MetricsSink

    engine = engines.load(linear_flow.Flow("f").add(Ok("a"), Lost("lost")))
    with EventListener(engine, MetricsSink(role="engine", registry=registry)):
        _run(engine)
    value = registry.get_sample_value
    assert value("flowengine_dead_letters_total", {"role": "engine", "task": "lost"}) == 1
    assert value("flowengine_atom_outcomes_total",
                 {"role": "engine", "task": "a", "state": "REVERTED"}) == 1
    assert value("flowengine_flows_total", {"state": "REVERTED"}) == 1
    assert value("flowengine_atoms_in_flight", {"role": "engine"}) == 0


def test_metrics_without_prometheus_client_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowengine.worker_based import metrics

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"pip install 'flowengine\[metrics\]'"):
        metrics.MetricsSink()
    with pytest.raises(ImportError, match="metrics"):
        metrics.start_metrics_server(0)
