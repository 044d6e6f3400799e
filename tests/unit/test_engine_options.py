"""Engine options on every engine: a misspelt one is refused with the nearest name, TaskFlow's
names and ``None`` values keep working, and an option another engine reads is accepted."""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from typing import Any

import pytest
from behaviour import tasks  # tests/ is on sys.path (rootdir conftest)

from flowengine import engines, states
from flowengine.engines.options import TASKFLOW_OPTIONS, EngineOptions
from flowengine.flows import unordered_flow


@pytest.mark.parametrize("engine", ["serial", "parallel", "worker-based"])
@pytest.mark.parametrize(("given", "nearest"), [
    ("nevr_resolve", "never_resolve"),
    ("defer_revert", "defer_reverts"),
    ("deadlin", "deadline"),
    ("time_limit", "time_limits"),
])  # fmt: skip
def test_a_misspelt_option_is_refused_on_every_engine_naming_its_nearest_name(
    engine: str, given: str, nearest: str,
) -> None:
    remote = {"transport": "memory", "topics": ["t"]} if engine == "worker-based" else {}
    with pytest.raises(ValueError, match=rf"Unknown {engine} engine option\(s\): '{given}' "
                                         rf"\(did you mean '{nearest}'\?\)"):
        engines.load(tasks.Step("s"), engine=engine, **remote, **{given: True})


def test_every_misspelt_option_is_named_at_once() -> None:
    with pytest.raises(ValueError, match=r"'max_worker' \(did you mean 'max_workers'\?\), "
                                         r"'nope'"):
        engines.load(tasks.Step("s"), engine="parallel", max_worker=2, nope=1)


@pytest.mark.parametrize("engine", ["serial", "parallel"])
def test_taskflow_options_with_none_values_load_and_run(engine: str) -> None:
    # What a TaskFlow program may pass, worker-based options included: one program, any engine.
    options: dict[str, Any] = dict.fromkeys(TASKFLOW_OPTIONS - {"inject_transient"})
    options["gather_statistics"] = True
    loaded = engines.load(tasks.Step("s"), engine=engine, **options)
    loaded.run()
    assert loaded.storage.get_flow_state() == states.SUCCESS


def test_the_worker_based_engine_ignores_taskflow_options_it_has_no_use_for() -> None:
    engine = engines.load(tasks.Step("s"), engine="worker-based", transport="memory",
                          topics=["t"], gather_statistics=False, polling_interval=1)
    assert engine.options["gather_statistics"] is False  # kept, as given


def test_the_options_every_engine_reads_are_typed_fields_not_extras() -> None:
    def clock() -> float:
        return 5.0

    options = EngineOptions.from_mapping(
        {"deadline": "30", "time_limits": {"s": 2}, "suspend_check_interval": 0,
         "retry_clock": clock, "locks": "lb:2,lb:1", "concurrency": "Reboot=3",
         "on_conflict": "REJECT", "coordination": "redis://127.0.0.1:6379",
         "lock_details": {"owner": "ops"}, "max_async_tasks": 4},
        kind="serial", extra={"max_async_tasks"})
    assert (options.deadline, options.time_limits, options.suspend_check_interval) == (
        30.0, {"s": 2.0}, 0.0)
    assert options.retry_clock is clock
    assert options.admission.locks == ("lb:1", "lb:2")
    assert options.admission.concurrency == {"Reboot": 3}
    assert options.admission.on_conflict == "reject"
    assert options.admission.coordination == "redis://127.0.0.1:6379"
    assert options.admission.lock_details == {"owner": "ops"}
    assert options.extra == {"max_async_tasks": 4}  # the local executors' own
    assert options.as_dict()["locks"] == ("lb:1", "lb:2")
    unchecked = EngineOptions.from_mapping({"anything": 1})  # no engine named: unchecked
    assert unchecked.extra == {"anything": 1} and unchecked.deadline is None


@pytest.mark.parametrize("engine", ["serial", "parallel", "worker-based"])
@pytest.mark.parametrize(("name", "value"), [
    ("deadline", -1),
    ("time_limits", {"s": 0}),
    ("suspend_check_interval", -1),
    ("retry_clock", 5),
    ("on_conflict", "maybe"),
    ("locks", [1]),
    ("concurrency", {"Reboot": 0}),
    ("lock_details", ["owner"]),
    ("executor", 5),
])  # fmt: skip
def test_a_bad_value_is_refused_on_every_engine_naming_its_option(
    engine: str, name: str, value: object,
) -> None:
    remote = {"transport": "memory", "topics": ["t"]} if engine == "worker-based" else {}
    with pytest.raises(ValueError, match=f"'{name}'"):
        engines.load(tasks.Step("s"), engine=engine, **remote, **{name: value})


def test_the_options_as_given_stay_what_engine_options_returns() -> None:
    engine = engines.load(tasks.Step("s"), engine="serial", deadline="30", locks="a")
    assert engine.options == {"deadline": "30", "locks": "a"}  # TaskFlow's: unresolved


def test_the_worker_based_engine_refuses_the_local_executors_option() -> None:
    with pytest.raises(ValueError, match="Unknown worker-based engine option"):
        engines.load(tasks.Step("s"), engine="worker-based", transport="memory",
                     topics=["t"], max_async_tasks=4)


class OnlySubmits:
    """A program's own executor: nothing but ``submit`` (as TaskFlow's parallel engine asks)."""

    def __init__(self) -> None:
        self.pool = cf.ThreadPoolExecutor(2)
        self.calls = 0

    def submit(self, fn: Callable[..., object], /, *args: object,
               **kwargs: object) -> cf.Future[object]:
        self.calls += 1
        return self.pool.submit(fn, *args, **kwargs)


@pytest.mark.parametrize("kind", ["only-submit", "futures", "threads", "none"])
def test_the_parallel_engine_runs_on_the_executor_given(kind: str) -> None:
    given: object = {"only-submit": OnlySubmits(), "futures": cf.ThreadPoolExecutor(2),
                     "threads": "Threads", "none": None}[kind]
    flow = unordered_flow.Flow("two").add(tasks.Step("a"), tasks.Step("b"))
    engine = engines.load(flow, engine="parallel", executor=given)
    assert engine.options["executor"] is given  # as given, TaskFlow's
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    if isinstance(given, OnlySubmits):
        assert given.calls == 2
        given.pool.shutdown()
    elif isinstance(given, cf.Executor):
        given.submit(lambda: None).result()  # the engine did not shut the program's pool
        given.shutdown()


@pytest.mark.parametrize(("given", "named"), [
    ({"backend": 123}, "backend must be a persistence backend, or its URI string or dict, "
                       "not 123"),
    ({"flow_detail": "fd"}, "flow_detail must be a FlowDetail, not 'fd'"),
    ({"book": 5}, "book must be a LogBook, not 5"),
])
def test_a_wrongly_typed_backend_flow_detail_or_book_is_refused_naming_it(
        given: dict[str, Any], named: str) -> None:
    flow = unordered_flow.Flow("f").add(tasks.Constant("a"))
    for load in (engines.load, engines.run):
        with pytest.raises(TypeError) as caught:
            load(flow, **given)
        assert str(caught.value) == named
