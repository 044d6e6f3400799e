"""What engines report: flow and atom events, the atom log, and the Prometheus metrics.

Local engines (serial, parallel) run the flows; the worker-based engine's side is in
``tests/integration/test_events.py``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)
from servers import require_module
from test_listeners import FailOnce  # tests/unit is on sys.path (pytest rootdir insertion)

from flowengine import engines, exceptions, retry, states, task
from flowengine.flows import linear_flow
from flowengine.listeners.atoms import LOGGER_NAME, AtomLogListener
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.event_listener import EventListener, PlacementSink

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


class Steps(task.Task):
    """Reports its progress in steps, executing and reverting."""

    def execute(self) -> None:
        self.update_progress(0.25)
        self.update_progress(0.75)

    def revert(self, **kwargs: Any) -> None:
        self.update_progress(0.5)


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


@pytest.mark.parametrize("kind", ENGINES)
def test_each_progress_update_is_one_task_progress_event(kind: str) -> None:
    flow = linear_flow.Flow("f").add(Steps("steps"), Lost("lost"))
    engine = engines.load(flow, engine=kind)
    sink = Recorder()
    with EventListener(engine, sink):
        _run(engine)
    progress = [fields for event_type, fields in sink.events if event_type == "task-progress"]
    # The engine's own 0.0 before and 1.0 after each execute and revert are not the task's.
    assert [(p["action"], p["progress"]) for p in progress] == [
        ("execute", 0.25), ("execute", 0.75), ("revert", 0.5)]
    assert {(p["flow_uuid"], p["atom_uuid"], p["task_name"], p["attempt"]) for p in progress} \
        == {(engine.storage.flow_uuid, engine.storage.get_atom_uuid("steps"), "steps", 1)}
    types = sink.types()
    assert types.index("task-progress") == types.index("task-started") + 1
    assert all(len(t.notifier) == 0 for t in flow)  # the progress listeners are gone


@pytest.mark.parametrize("task_events", [True, False])
def test_retry_controllers_report_and_a_retry_is_task_retried(task_events: bool) -> None:
    flaky = FailOnce("flaky")
    flow = linear_flow.Flow("f", retry=retry.Times(3, name="again")).add(flaky)
    engine = engines.load(flow)
    sink = Recorder()
    with EventListener(engine, sink, task_events=task_events):
        engine.run()
    # The engine always runs retry controllers: it reports them even when workers run tasks.
    ours = [(t, f["task_name"]) for t, f in sink.events if f.get("kind") == "retry"]
    assert ours == [("task-started", "again"), ("task-succeeded", "again"),
                    ("task-retried", "again"),
                    ("task-started", "again"), ("task-succeeded", "again")]
    retried = dict(sink.events)["task-retried"]
    assert (retried["decision"], retried["history"], retried["attempt"]) == ("RETRY", 1, 2)
    assert retried["delay"] == 0.0
    assert retried["atom_uuid"] == engine.storage.get_atom_uuid("again")
    assert (retried["failed_atom"], retried["exc_type"], retried["exception"]) == (
        "flaky", "RuntimeError", "once")
    assert sink.types()[-1] == "flow-succeeded"


def test_a_retry_that_waits_reports_its_delay() -> None:
    flow = linear_flow.Flow("f", retry=retry.Times(3, name="again", delay=0.01, backoff=3.0))
    engine = engines.load(flow.add(FailOnce("flaky")))
    sink = Recorder()
    with EventListener(engine, sink):
        engine.run()
    retried = dict(sink.events)["task-retried"]
    assert (retried["attempt"], retried["delay"]) == (2, 0.01)


def test_placement_keeps_every_attempt_of_an_atom() -> None:
    placed = PlacementSink()
    placed.emit("task-sent", atom_uuid="u", attempt=1, worker="w1", action="execute")
    placed.emit("task-lost", atom_uuid="u", attempt=1, worker="w1")
    placed.emit("task-sent", atom_uuid="u", attempt=2, worker="w2", action="execute")
    assert placed("u") == (2, "w2") and placed("other") == (None, None)
    assert placed.settle("u", states.SUCCESS) == [
        {"attempt": 1, "action": "execute", "worker": "w1", "outcome": "LOST"},
        {"attempt": 2, "action": "execute", "worker": "w2", "outcome": "SUCCESS"}]
    placed.emit("task-sent", atom_uuid="u", attempt=1, worker="w3", action="revert")
    assert placed.settle("u", states.REVERT_FAILURE) == [
        {"attempt": 1, "action": "revert", "worker": "w3", "outcome": "REVERT_FAILURE"}]
    assert placed.settle("u", states.REVERTED) == []


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


class Slow(task.Task):
    clock: ManualClock

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
    clock = ManualClock(100.0)
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
    prometheus_client = require_module("prometheus_client")
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


def test_metrics_count_a_workers_reverts_as_reverts(registry: Any) -> None:
    from flowengine.worker_based.metrics import MetricsSink

    sink = MetricsSink(role="worker", registry=registry)
    for event_type, task_name in (("task-succeeded", "a"), ("task-failed", "b")):
        sink.emit("task-started", task_name=task_name, action="revert")
        sink.emit(event_type, task_name=task_name, action="revert", runtime=0.5)

    def outcome(task_name: str, state: str) -> float | None:
        return registry.get_sample_value(
            "flowengine_atom_outcomes_total",
            {"role": "worker", "task": task_name, "state": state})

    assert (outcome("a", "REVERTED"), outcome("b", "REVERT_FAILURE")) == (1, 1)
    assert (outcome("a", "SUCCESS"), outcome("b", "FAILURE")) == (None, None)
    assert registry.get_sample_value("flowengine_atoms_in_flight", {"role": "worker"}) == 0
    assert registry.get_sample_value("flowengine_atom_duration_seconds_count",
                                     {"role": "worker", "task": "a", "action": "revert"}) == 1


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


def test_placement_follows_the_worker_that_took_the_attempt() -> None:
    # Workers sharing a topic share its queue: another one than the chosen may run it.
    placed = PlacementSink()
    placed.emit("task-sent", atom_uuid="u", attempt=1, worker="w1", action="execute")
    placed.emit("task-moved", atom_uuid="u", attempt=1, worker="w2", from_worker="w1")
    placed.emit("task-moved", atom_uuid="u", attempt=7, worker="w9", from_worker="w2")  # stale
    assert placed("u") == (1, "w2")
    assert placed.settle("u", states.SUCCESS) == [
        {"attempt": 1, "action": "execute", "worker": "w2", "outcome": "SUCCESS"}]


@pytest.mark.timeout(180)  # 27 s on a loaded 2-core machine (it churns the garbage collector)
def test_each_registry_gets_its_own_metrics_even_at_a_reused_address() -> None:
    # A registry that is gone may leave its address to the next one: metrics must follow the
    # object, not its id, or the new registry never sees a sample.
    import gc

    prometheus_client = require_module("prometheus_client")
    from flowengine.worker_based.metrics import MetricsSink

    seen: set[int] = set()
    for _ in range(50):
        registry = prometheus_client.CollectorRegistry()
        seen.add(id(registry))
        MetricsSink(role="engine", registry=registry).emit("flow-succeeded", flow_name="f")
        assert registry.get_sample_value("flowengine_flows_total", {"state": "SUCCESS"}) == 1
        del registry
        gc.collect()
    assert len(seen) < 50, "no address was reused: this test proves nothing here"
