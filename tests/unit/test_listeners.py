"""Listeners attached to real engines: what they capture, log, print and record in metadata."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine import engines, exceptions, retry, states, task
from flowengine.flows import linear_flow
from flowengine.listeners import base, capturing, printing, timing
from flowengine.listeners import logging as logging_listeners
from flowengine.types.notifier import Notifier, RestrictedNotifier

ENGINES = ["serial", "parallel"]


class Ok(task.Task):
    def execute(self) -> str:
        return self.name


class Fail(task.Task):
    def execute(self) -> None:
        raise RuntimeError("Woot!")


class FailOnce(task.Task):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls = 0

    def execute(self) -> str:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("once")
        return "ok"


class Takes(task.Task):
    """Takes ``seconds`` of the fake clock to execute and half that to revert."""

    def __init__(self, name: str, clock: ManualClock, seconds: float) -> None:
        super().__init__(name)
        self._clock = clock
        self._seconds = seconds

    def execute(self) -> None:
        self._clock.advance(self._seconds)

    def revert(self, **kwargs: Any) -> None:
        self._clock.advance(self._seconds / 2)


def flat(values: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """Captured ``(kind, state, details)`` as ``'name.k STATE(result)'``, as TaskFlow tests do."""
    out = []
    for kind, state, details in values:
        entry = f"{details[kind + '_name']}.{kind[0]} {state}"
        if "result" in details:
            entry += f"({details['result']})"
        out.append(entry)
    return out


def ok_flow() -> linear_flow.Flow:
    return linear_flow.Flow("f").add(Ok("a"), Ok("b"))


def failing_flow() -> linear_flow.Flow:
    return linear_flow.Flow("f").add(Ok("a"), Ok("b"), Fail("c"))


def atom_meta(engine: Any, name: str) -> dict[str, Any]:
    detail = engine.storage.flow_detail.find(engine.storage.get_atom_uuid(name))
    assert detail is not None
    return dict(detail.meta)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def levels(self) -> set[int]:
        return {r.levelno for r in self.records}

    def find(self, *fragments: str) -> logging.LogRecord:
        """The one record whose message contains every fragment."""
        found = [r for r in self.records if all(f in r.getMessage() for f in fragments)]
        assert len(found) == 1, (fragments, [r.getMessage() for r in self.records])
        return found[0]


@pytest.fixture
def log(request: pytest.FixtureRequest) -> Iterator[tuple[logging.Logger, Records]]:
    """A private logger (not propagating) and the records it received."""
    logger = logging.getLogger(f"tests.listeners.{request.node.name}")
    handler = Records()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


# -- base ----------------------------------------------------------------------------------------


def test_public_constants_match_taskflow() -> None:
    assert base.FINISH_STATES == (
        states.FAILURE,
        states.SUCCESS,
        states.REVERTED,
        states.REVERT_FAILURE,
    )
    assert base.DEFAULT_LISTEN_FOR == (Notifier.ANY,)
    assert timing.STARTING_STATES == {states.RUNNING, states.REVERTING}
    assert timing.FINISHED_STATES == set(base.FINISH_STATES)
    assert timing.WATCH_STATES == set(base.FINISH_STATES) | {
        states.RUNNING,
        states.REVERTING,
        states.PENDING,
    }
    assert (capturing.CaptureListener.FLOW, capturing.CaptureListener.TASK) == ("flow", "task")
    assert capturing.CaptureListener.RETRY == "retry"


def test_register_and_deregister_are_idempotent() -> None:
    engine = engines.load(ok_flow())
    listener = base.Listener(engine)
    listener.register()
    listener.register()
    assert (len(engine.notifier), len(engine.atom_notifier)) == (1, 2)
    listener.deregister()
    listener.deregister()
    assert (len(engine.notifier), len(engine.atom_notifier)) == (0, 0)


def test_listening_for_nothing_registers_nothing() -> None:
    engine = engines.load(ok_flow())
    with base.Listener(engine, task_listen_for=(), flow_listen_for=None, retry_listen_for=[]):
        assert (len(engine.notifier), len(engine.atom_notifier)) == (0, 0)


def test_a_single_state_may_be_given_as_a_string() -> None:
    engine = engines.load(ok_flow())
    with capturing.CaptureListener(
        engine, task_listen_for=states.SUCCESS, flow_listen_for=states.SUCCESS
    ) as capturer:
        engine.run()
    assert flat(capturer.values) == ["a.t SUCCESS(a)", "b.t SUCCESS(b)", "f.f SUCCESS"]


def test_context_exit_deregisters_even_when_the_run_raises() -> None:
    engine = engines.load(failing_flow())
    with pytest.raises(RuntimeError, match="Woot!"):
        with capturing.CaptureListener(engine) as listener:
            engine.run()
    assert (len(engine.notifier), len(engine.atom_notifier)) == (0, 0)
    assert flat(listener.values)[-1] == "f.f REVERTED"


def test_registration_is_all_or_nothing() -> None:
    class StubEngine:
        notifier = RestrictedNotifier([states.RUNNING])
        atom_notifier = Notifier()

    engine: Any = StubEngine()
    listener = base.Listener(engine, flow_listen_for=[states.RUNNING, "NOT-A-STATE"])
    with pytest.raises(ValueError, match="NOT-A-STATE"):
        listener.register()
    assert len(engine.notifier) == 0
    listener.deregister()
    assert len(engine.atom_notifier) == 0


def test_a_raising_listener_is_logged_and_does_not_break_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(base.Listener):
        def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
            raise ValueError(f"cannot handle {state}")

        def _flow_receiver(self, state: str, details: dict[str, Any]) -> None:
            raise KeyError(state)

    engine = engines.load(ok_flow())
    caplog.set_level(logging.WARNING, logger="flowengine")
    with Broken(engine), capturing.CaptureListener(engine) as capturer:
        engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert flat(capturer.values) == [
        "f.f RUNNING",
        "a.t RUNNING",
        "a.t SUCCESS(a)",
        "b.t RUNNING",
        "b.t SUCCESS(b)",
        "f.f SUCCESS",
    ]
    messages = [r.getMessage() for r in caplog.records if r.name == "flowengine.listeners.base"]
    assert "Listener Broken failed handling task 'a' moving into state 'RUNNING'" in messages[1]
    assert len(messages) == 6
    assert all(r.exc_info for r in caplog.records if r.name == "flowengine.listeners.base")


# -- capturing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine_name", ENGINES)
def test_capture_of_a_failing_linear_flow(engine_name: str) -> None:
    engine = engines.load(failing_flow(), engine=engine_name)
    with capturing.CaptureListener(engine) as capturer:
        with pytest.raises(RuntimeError):
            engine.run()
    assert flat(capturer.values) == [
        "f.f RUNNING",
        "a.t RUNNING",
        "a.t SUCCESS(a)",
        "b.t RUNNING",
        "b.t SUCCESS(b)",
        "c.t RUNNING",
        "c.t FAILURE(Failure: RuntimeError: Woot!)",
        "c.t REVERTING",
        "c.t REVERTED(None)",
        "b.t REVERTING",
        "b.t REVERTED(None)",
        "a.t REVERTING",
        "a.t REVERTED(None)",
        "f.f REVERTED",
    ]
    kind, state, details = capturer.values[0]
    assert (kind, state) == (capturing.CaptureListener.FLOW, states.RUNNING)
    assert details["engine"] is engine and details["flow_uuid"] == engine.storage.flow_uuid


def test_capture_keeps_retries_apart_from_tasks() -> None:
    flow = linear_flow.Flow("f", retry=retry.Times(3, name="r")).add(Ok("a"), FailOnce("b"))
    engine = engines.load(flow)
    with capturing.CaptureListener(engine) as capturer:
        engine.run()
    assert flat(capturer.values) == [
        "f.f RUNNING",
        "r.r RUNNING",
        "r.r SUCCESS(1)",
        "a.t RUNNING",
        "a.t SUCCESS(a)",
        "b.t RUNNING",
        "b.t FAILURE(Failure: RuntimeError: once)",
        "b.t REVERTING",
        "b.t REVERTED(None)",
        "a.t REVERTING",
        "a.t REVERTED(None)",
        "r.r RETRYING",
        "a.t PENDING",
        "b.t PENDING",
        "r.r RUNNING",
        "r.r SUCCESS(2)",
        "a.t RUNNING",
        "a.t SUCCESS(a)",
        "b.t RUNNING",
        "b.t SUCCESS(ok)",
        "f.f SUCCESS",
    ]


def test_capture_of_a_reverted_retry_carries_its_result() -> None:
    flow = linear_flow.Flow("f", retry=retry.Times(2, name="r")).add(Fail("b"))
    engine = engines.load(flow)
    with capturing.CaptureListener(engine, task_listen_for=(), flow_listen_for=()) as capturer:
        with pytest.raises(RuntimeError):
            engine.run()
    assert flat(capturer.values)[-1] == "r.r REVERTED(None)"


def test_capture_filters() -> None:
    engine = engines.load(failing_flow())
    previous: list[Any] = ["earlier"]
    only_flow = capturing.CaptureListener(engine, capture_task=False)
    skipping = capturing.CaptureListener(engine, skip_tasks=["a", "c"], skip_flows=["f"])
    successes = capturing.CaptureListener(
        engine, task_listen_for=[states.SUCCESS], flow_listen_for=(), values=previous
    )
    with only_flow, skipping, successes:
        with pytest.raises(RuntimeError):
            engine.run()
    assert flat(only_flow.values) == ["f.f RUNNING", "f.f REVERTED"]
    assert flat(skipping.values) == [
        "b.t RUNNING",
        "b.t SUCCESS(b)",
        "b.t REVERTING",
        "b.t REVERTED(None)",
    ]
    assert successes.values is previous
    assert previous[0] == "earlier" and flat(previous[1:]) == ["a.t SUCCESS(a)", "b.t SUCCESS(b)"]


def test_capture_format_can_be_overridden() -> None:
    class Named(capturing.CaptureListener):
        @staticmethod
        def _format_capture(kind: str, state: str, details: dict[str, Any]) -> Any:
            return f"{details[kind + '_name']} {state}"

    engine = engines.load(linear_flow.Flow("f").add(Ok("a")))
    with Named(engine) as capturer:
        engine.run()
    assert capturer.values == ["f RUNNING", "a RUNNING", "a SUCCESS", "f SUCCESS"]


def test_capture_matches_taskflow() -> None:
    tf_engines = importlib.import_module("taskflow.engines")  # a test dependency
    from taskflow import task as tf_task
    from taskflow.listeners import capturing as tf_capturing
    from taskflow.patterns import linear_flow as tf_linear_flow

    class TfOk(tf_task.Task):
        def execute(self) -> str:
            return self.name

    class TfFail(tf_task.Task):
        def execute(self) -> None:
            raise RuntimeError("Woot!")

    tf_engine = tf_engines.load(tf_linear_flow.Flow("f").add(TfOk("a"), TfOk("b"), TfFail("c")))
    with tf_capturing.CaptureListener(tf_engine) as tf_capturer:
        with pytest.raises(RuntimeError):
            tf_engine.run()
    engine = engines.load(failing_flow())
    with capturing.CaptureListener(engine) as capturer:
        with pytest.raises(RuntimeError):
            engine.run()
    assert flat(capturer.values) == flat(tf_capturer.values)
    assert [(k, s, sorted(d)) for k, s, d in capturer.values] == [
        (k, s, sorted(d)) for k, s, d in tf_capturer.values
    ]


# -- printing ------------------------------------------------------------------------------------


def test_printing_listener_prints_taskflow_messages(capsys: pytest.CaptureFixture[str]) -> None:
    engine = engines.load(linear_flow.Flow("f").add(Ok("a")))
    with printing.PrintingListener(engine):
        engine.run()
    flow_uuid, a_uuid = engine.storage.flow_uuid, engine.storage.get_atom_uuid("a")
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out.splitlines() == [
        f"{engine} has moved flow 'f' ({flow_uuid}) into state 'RUNNING' from state 'PENDING'",
        f"{engine} has moved task 'a' ({a_uuid}) into state 'RUNNING' from state 'PENDING'",
        f"{engine} has moved task 'a' ({a_uuid}) into state 'SUCCESS' from state 'RUNNING'"
        " with result 'a' (failure=False)",
        f"{engine} has moved flow 'f' ({flow_uuid}) into state 'SUCCESS' from state 'RUNNING'",
    ]


def test_printing_listener_prints_failures_with_traceback_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine = engines.load(linear_flow.Flow("f").add(Fail("c")))
    with printing.PrintingListener(engine, stderr=True):
        with pytest.raises(RuntimeError):
            engine.run()
    out = capsys.readouterr()
    assert out.out == ""
    assert (
        "into state 'FAILURE' from state 'RUNNING' with result"
        " 'Failure: RuntimeError: Woot!' (failure=True)"
    ) in out.err
    assert "Traceback (most recent call last):" in out.err
    assert "RuntimeError: Woot!" in out.err


# -- logging -------------------------------------------------------------------------------------


def test_logging_listener_logs_at_one_level(log: tuple[logging.Logger, Records]) -> None:
    logger, records = log
    engine = engines.load(failing_flow())
    with logging_listeners.LoggingListener(engine, log=logger, level=logging.INFO):
        with pytest.raises(RuntimeError):
            engine.run()
    assert records.levels() == {logging.INFO}
    assert [r for r in records.records if r.exc_info] == [
        records.find("into state 'FAILURE' from state 'RUNNING'")
    ]
    assert records.records[0].getMessage() == (
        f"{engine} has moved flow 'f' ({engine.storage.flow_uuid}) into state 'RUNNING'"
        " from state 'PENDING'"
    )


def test_logging_listener_defaults_to_its_module_logger(caplog: pytest.LogCaptureFixture) -> None:
    engine = engines.load(ok_flow())
    with caplog.at_level(logging.DEBUG, logger="flowengine.listeners.logging"):
        with logging_listeners.LoggingListener(engine):
            engine.run()
    mine = [r for r in caplog.records if r.name == "flowengine.listeners.logging"]
    assert len(mine) == 6 and {r.levelno for r in mine} == {logging.DEBUG}


def test_logging_listener_class_logger_is_used(log: tuple[logging.Logger, Records]) -> None:
    logger, records = log

    class Mine(logging_listeners.LoggingListener):
        _LOGGER = logger

    engine = engines.load(ok_flow())
    with Mine(engine):
        engine.run()
    assert len(records.records) == 6


@pytest.mark.parametrize("engine_name", ENGINES)
def test_dynamic_logging_of_success(engine_name: str, log: tuple[logging.Logger, Records]) -> None:
    logger, records = log
    engine = engines.load(ok_flow(), engine=engine_name)
    with logging_listeners.DynamicLoggingListener(engine, log=logger):
        engine.run()
    assert records.levels() == {logging.DEBUG}
    assert not any(r.exc_info for r in records.records)
    a_uuid = engine.storage.get_atom_uuid("a")
    assert records.find("Task 'a' (", "into state 'RUNNING'").getMessage() == (
        f"Task 'a' ({a_uuid}) transitioned into state 'RUNNING' from state 'PENDING'"
    )
    assert records.find("Task 'a' (", "'SUCCESS' from state 'RUNNING' with result 'a'")
    flow_uuid = engine.storage.flow_uuid
    assert [r.getMessage() for r in records.records if r.getMessage().startswith("Flow")] == [
        f"Flow 'f' ({flow_uuid}) transitioned into state 'RUNNING' from state 'PENDING'",
        f"Flow 'f' ({flow_uuid}) transitioned into state 'SUCCESS' from state 'RUNNING'",
    ]


def test_dynamic_logging_of_failure(log: tuple[logging.Logger, Records]) -> None:
    logger, records = log
    engine = engines.load(failing_flow())
    with logging_listeners.DynamicLoggingListener(engine, log=logger):
        with pytest.raises(RuntimeError):
            engine.run()
    failed = records.find("Task 'c' (", "into state 'FAILURE'")
    assert failed.levelno == logging.WARNING
    assert failed.exc_info is not None and failed.exc_info[0] is RuntimeError
    assert "3 predecessors (most recent first):" in failed.getMessage()
    assert "  Atom 'b' {'intention': 'EXECUTE', 'state': 'SUCCESS'" in failed.getMessage()
    warned = [r.getMessage() for r in records.records if r.levelno == logging.WARNING]
    assert len(warned) == 5  # c FAILURE, c/b/a REVERTED, flow REVERTED
    assert "Flow 'f'" in warned[-1] and "'REVERTED' from state 'RUNNING'" in warned[-1]
    assert records.levels() == {logging.DEBUG, logging.WARNING}


def test_dynamic_logging_failure_level_is_configurable(
    log: tuple[logging.Logger, Records],
) -> None:
    logger, records = log
    engine = engines.load(failing_flow())
    listener = logging_listeners.DynamicLoggingListener(
        engine, log=logger, failure_level=logging.ERROR, level=logging.INFO
    )
    with listener:
        with pytest.raises(RuntimeError):
            engine.run()
    assert records.levels() == {logging.INFO, logging.ERROR}
    assert len([r for r in records.records if r.exc_info]) == 1


def test_dynamic_logging_hides_results(log: tuple[logging.Logger, Records]) -> None:
    logger, records = log
    engine = engines.load(ok_flow())
    with logging_listeners.DynamicLoggingListener(engine, log=logger, hide_inputs_outputs_of=["a"]):
        engine.run()
    success = [r.getMessage() for r in records.records if "'SUCCESS'" in r.getMessage()]
    assert success[0].endswith("from state 'RUNNING'")
    assert success[1].endswith("with result 'b'")


def test_dynamic_logging_skips_results_its_logger_would_drop(
    log: tuple[logging.Logger, Records],
) -> None:
    logger, records = log
    logger.setLevel(logging.WARNING)
    engine = engines.load(failing_flow())
    with logging_listeners.DynamicLoggingListener(engine, log=logger):
        with pytest.raises(RuntimeError):
            engine.run()
    reverted = [
        r.getMessage() for r in records.records if "into state 'REVERTED'" in r.getMessage()
    ]
    assert len(reverted) == 4
    assert not any("with result" in message for message in reverted)


def test_dynamic_logging_uses_the_given_failure_formatter(
    log: tuple[logging.Logger, Records],
) -> None:
    logger, records = log
    seen: list[str] = []

    class Formatter:
        def format(self, fail: Any, atom_matcher: Any) -> tuple[Any, str]:
            seen.extend(a.name for a in engine.compilation.iter_atoms() if atom_matcher(a))
            return None, "custom details"

    engine = engines.load(failing_flow())
    with logging_listeners.DynamicLoggingListener(engine, log=logger, fail_formatter=Formatter()):
        with pytest.raises(RuntimeError):
            engine.run()
    assert seen == ["c"]
    failed = records.find("Task 'c' (", "into state 'FAILURE'")
    assert failed.getMessage().endswith("'FAILURE' from state 'RUNNING'\ncustom details")
    assert failed.exc_info is None


# -- timing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine_name", ENGINES)
def test_durations_are_saved_in_metadata(engine_name: str) -> None:
    clock = ManualClock()
    flow = linear_flow.Flow("f").add(Takes("a", clock, 2.0), Takes("b", clock, 3.0))
    engine = engines.load(flow, engine=engine_name)
    with timing.DurationListener(engine, clock=clock):
        engine.run()
    assert atom_meta(engine, "a")["duration"] == 2.0
    assert atom_meta(engine, "b")["duration"] == 3.0
    assert engine.storage.flow_meta["duration"] == 5.0


def test_duration_of_a_reverted_task_is_its_revert() -> None:
    clock = ManualClock()
    flow = linear_flow.Flow("f").add(Takes("a", clock, 2.0), Fail("c"))
    engine = engines.load(flow)
    with timing.DurationListener(engine, clock=clock):
        with pytest.raises(RuntimeError):
            engine.run()
    assert atom_meta(engine, "a")["duration"] == 1.0
    assert atom_meta(engine, "c")["duration"] == 0.0
    assert engine.storage.flow_meta["duration"] == 3.0


def test_printing_duration_listener() -> None:
    clock = ManualClock()
    lines: list[str] = []
    engine = engines.load(linear_flow.Flow("f").add(Takes("a", clock, 1.25)))
    with timing.PrintingDurationListener(engine, printer=lines.append, clock=clock):
        engine.run()
    assert lines == [
        "'f' flow started.",
        "'a' task started.",
        "It took task 'a' 1.25 seconds to finish.",
        "It took flow 'f' 1.25 seconds to finish.",
    ]
    assert atom_meta(engine, "a")["duration"] == 1.25


def test_duration_storage_failure_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = engines.load(ok_flow())

    def refuse(name: str, update: Any) -> None:
        raise exceptions.StorageFailure(f"cannot write metadata of {name!r}")

    monkeypatch.setattr(engine.storage, "update_atom_metadata", refuse)
    with caplog.at_level(logging.WARNING, logger="flowengine.listeners.timing"):
        with timing.DurationListener(engine):
            engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    messages = [r.getMessage() for r in caplog.records if r.name == "flowengine.listeners.timing"]
    assert len(messages) == 2
    assert messages[0].startswith("Failure to store duration update {'duration': ")
    assert messages[0].endswith(" for task a")


def test_duration_listener_warns_about_unfinished_timers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Suspends(task.Task):
        def execute(self) -> None:
            engine.suspend()

    engine = engines.load(linear_flow.Flow("f").add(Suspends("s"), Ok("b")))
    with caplog.at_level(logging.WARNING, logger="flowengine.listeners.timing"):
        with timing.DurationListener(engine):
            engine.run()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert [r.getMessage() for r in caplog.records if r.name == "flowengine.listeners.timing"] == [
        "1 flow(s) did not enter ['FAILURE', 'REVERTED', 'REVERT_FAILURE', 'SUCCESS'] states: f"
    ]


def test_event_times_are_saved_in_metadata() -> None:
    clock = ManualClock(start=1_700_000_000.0)
    flow = linear_flow.Flow("f", retry=retry.Times(2, name="r")).add(Takes("a", clock, 4.0))
    engine = engines.load(flow)
    with timing.EventTimeListener(engine, clock=clock):
        engine.run()
    assert atom_meta(engine, "a")["RUNNING-timestamp"] == 1_700_000_000.0
    assert atom_meta(engine, "a")["SUCCESS-timestamp"] == 1_700_000_004.0
    assert {"RUNNING-timestamp", "SUCCESS-timestamp"} <= set(atom_meta(engine, "r"))
    flow_meta = engine.storage.flow_meta
    assert flow_meta["SUCCESS-timestamp"] - flow_meta["RUNNING-timestamp"] == 4.0
