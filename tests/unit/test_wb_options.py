"""Worker-based engine options: one typed, frozen record, validated where it is built."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from behaviour import tasks
from kombu.transport.memory import Transport as MemoryTransport
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.events import FanoutSink
from flowengine.worker_based.executor import WorkerTaskExecutor
from flowengine.worker_based.options import WorkerEngineOptions
from flowengine.worker_based.worker import Worker


def test_no_options_are_the_defaults() -> None:
    options = WorkerEngineOptions.from_mapping({})
    assert options == WorkerEngineOptions()
    assert (options.exchange, options.transition_timeout, options.max_attempts) == (
        "default", pr.REQUEST_TIMEOUT, ext.DEFAULT_MAX_ATTEMPTS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.exchange = "other"  # type: ignore[misc]


def test_none_means_the_default_and_none_for_timeouts_means_never() -> None:
    options = WorkerEngineOptions.from_mapping(
        {"exchange": None, "max_attempts": None, "transition_timeout": None,
         "lease_timeout": "none"})
    assert (options.exchange, options.max_attempts) == ("default", ext.DEFAULT_MAX_ATTEMPTS)
    assert options.transition_timeout is None and options.lease_timeout is None


def test_values_are_converted_to_their_types() -> None:
    options = WorkerEngineOptions.from_mapping(
        {"topics": "a,b", "transition_timeout": "5", "max_attempts": "4", "events": "false",
         "retry_options": {"interval_start": 1}, "time_limits": {"t": 2},
         "metrics_port": "9100"})
    assert options.topics == ("a", "b") and options.transition_timeout == 5.0
    assert options.max_attempts == 4 and options.events is False
    assert options.retry_options == bo.RetryOptions(interval_start=1.0)
    assert options.time_limits == {"t": 2.0} and options.metrics_port == 9100


def test_a_misspelt_option_is_an_error_naming_it_and_its_nearest_name() -> None:
    with pytest.raises(ValueError, match=r"Unknown worker-based engine option\(s\): "
                                         r"'transition_timout' \(did you mean "
                                         r"'transition_timeout'\?\)"):
        WorkerEngineOptions.from_mapping({"transition_timout": 5})


@pytest.mark.parametrize(("name", "value", "wanted"), [
    ("max_attempts", 0, "a whole number of at least 1"),
    ("max_attempts", 1.5, "a whole number of at least 1"),
    ("transition_timeout", "soon", "a number of seconds"),
    ("heartbeat_interval", -1, "a positive number of seconds"),
    ("topics", [1], "a list of topic names"),
    ("exchange", 3, "a non-empty string"),
    ("transport_options", "x=1", "a mapping"),
    ("transport", 5, "a transport name or a kombu Transport class"),
    ("transport", dict, "a transport name or a kombu Transport class"),
    ("metrics_port", 70000, "a port number from 0 to 65535"),
    ("taskflow_compat", "perhaps", ""),
])
def test_a_wrongly_typed_option_is_an_error_naming_it(name: str, value: object,
                                                       wanted: str) -> None:
    with pytest.raises(ValueError, match=repr(name)) as caught:
        WorkerEngineOptions.from_mapping({name: value})
    assert wanted in str(caught.value)


def test_a_transport_is_a_name_or_a_kombu_transport_class_wherever_a_broker_is_named() -> None:
    assert WorkerEngineOptions.from_mapping({"transport": "memory"}).transport == "memory"
    assert WorkerEngineOptions.from_mapping({"transport": MemoryTransport}).transport \
        is MemoryTransport
    # A worker names its broker through the same Broker spec, and is told alike.
    with pytest.raises(TypeError, match="'transport' must be a transport name .* not 5"):
        Worker("x", "t", [tasks.Constant], transport=5)  # type: ignore[arg-type]


def test_a_lease_no_longer_than_the_heartbeat_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="'lease_timeout' .* must be longer than"):
        WorkerEngineOptions.from_mapping({"lease_timeout": 1, "heartbeat_interval": 2})


def test_engines_load_refuses_a_misspelt_worker_based_option() -> None:
    with pytest.raises(ValueError, match="'topic'.*did you mean 'topics'"):
        engines.load(tasks.Step("s"), engine="worker-based", topic="x", transport="memory")


def test_unserved_timeout_is_seconds_none_disables_it_and_reaches_the_executor() -> None:
    assert WorkerEngineOptions().unserved_timeout == ext.DEFAULT_UNSERVED_TIMEOUT
    options = WorkerEngineOptions.from_mapping({"unserved_timeout": "2.5"})
    assert options.unserved_timeout == 2.5  # the record the executor is made from
    assert WorkerEngineOptions.from_mapping({"unserved_timeout": None}).unserved_timeout is None
    with pytest.raises(ValueError, match="'unserved_timeout' must be a positive number"):
        WorkerEngineOptions.from_mapping({"unserved_timeout": 0})


def test_an_injected_clock_times_the_requests_of_a_worker_based_engine() -> None:
    # Nobody serves the topic: the request waits, and fails once the injected clock (not the
    # real one) says its transition timeout is over.
    assert WorkerEngineOptions().clock is not None
    clock = ManualClock()
    engine = engines.load(tasks.Step("lonely"), engine="worker-based", transport="memory",
                          exchange=f"clock-{id(clock)}", topics=["nobody"],
                          transition_timeout=3600, clock=clock, events=False)
    runs = iter(engine.run_iter())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _state in runs:
                pass
        except BaseException as err:  # looked at below
            errors.append(err)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    for _ in range(600):  # an hour of the test clock, a step at a time, until it gives up
        runner.join(0.05)
        if not runner.is_alive():
            break
        clock.advance(3601)
    assert not runner.is_alive(), "the request never expired by the injected clock"
    assert errors and isinstance(errors[0], exc.RequestTimeout), errors


def test_the_executor_is_made_from_the_engines_record_and_its_keywords_checked_alike() -> None:
    # TaskFlow's constructor keywords are checked as the engine's options are...
    with pytest.raises(ValueError, match="'max_attempts' must be a whole number of at least 1"):
        WorkerTaskExecutor("x", "x", ["t"], transport="memory", max_attempts=0)
    with pytest.raises(ValueError, match="'lease_timeout' .* must be longer than"):
        WorkerTaskExecutor("x", "x", ["t"], transport="memory", lease_timeout=1,
                           heartbeat_interval=2)
    # ...and a validated record is taken as it is (what the engine does).
    options = WorkerEngineOptions.from_mapping({"transport": "memory", "topics": ["billing"]})
    sink = FanoutSink()  # not the default (no events)
    made = WorkerTaskExecutor.from_options("y", options, events=sink)
    assert made.events is sink and made.attempts() == []
