"""The whole engine behaviour suite, on real brokers, with tasks in worker processes.

Every test of ``tests/behaviour`` that takes an engine factory (``engine_factory`` or
``concurrent_engine_factory``) runs here too, on each real broker (Redis, RabbitMQ, beanstalkd)
and on flowengine-fs (the default transport, no server), with its factory's engines reaching two
``flowengine worker`` processes. The list is generated, not picked: a new behaviour test joins
without an edit here, and one that cannot run remotely must be named in :data:`EXCLUDED` with
the reason (TaskFlow's own rule for what a worker can build).

The behaviour functions themselves run, with their own parametrization; each is wrapped so marks
added here (``xfail`` for a known engine bug) never reach the in-process suite. The atoms write
to a :class:`~behaviour.tasks.FileLedger` and meet at :class:`~behaviour.tasks.FileBarriers`,
which the worker processes find through the environment, so the scenarios' assertions read what
the workers did exactly as they read it in-process.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import behaviour
import pytest
from behaviour import async_tasks, tasks, test_parallel
from behaviour.harness import EngineFactory
from wbe_harness import BROKERS, Broker, WorkerFleet, require_broker, unique_exchange

from flowengine.worker_based.worker import TASK_THREAD_PREFIX

# Slowest test here: 17 s on a loaded 2-core machine; the default 60 s limit is too close.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "suite"
#: Two workers, each with enough threads for the widest concurrent scenario (four atoms).
WORKERS, THREADS = 2, 4
#: Seconds a request may wait to be taken; the workers are up before any scenario starts.
TRANSITION_TIMEOUT = 15.0

#: The fixtures through which a behaviour test gets engines that may run its tasks remotely.
REMOTE_FIXTURES = ("engine_factory", "concurrent_engine_factory")
#: Behaviour tests that take ``local_engine_factory``, each with why, and a test below keeps this
#: list true: atoms that cannot travel (by TaskFlow's rule that a worker rebuilds a task from its
#: class name and ``name`` alone, ``endpoint.generate``) and local-engine machinery.
_LOCAL_WATCHDOG = ("the local engines' watchdog; the worker-based engine bounds a call through "
                   "its attempt's deadline (tests/unit/test_wb_leases.py)")
_LOCAL_BACKEND_FAULTS = ("faults injected into this process's backend connection; the code that "
                         "handles them is the engine's, the same on every engine")
EXCLUDED = {
    "test_functor_task_requirements_come_from_the_function":
        "FunctorTask: its behaviour is the function given to its constructor",
    "test_functor_task_revert_function_gets_arguments_and_result":
        "FunctorTask: its execute and revert are functions given to its constructor",
    "test_map_and_reduce_functor_tasks":
        "MapFunctorTask/ReduceFunctorTask: functions given to their constructors",
    "test_a_revert_past_its_time_limit_is_a_revert_failure": _LOCAL_WATCHDOG,
    "test_the_engine_option_overrides_the_class_limit": _LOCAL_WATCHDOG,
    "test_a_call_past_its_time_limit_fails_the_atom_and_reverts": _LOCAL_WATCHDOG,
    "test_a_backend_that_stays_down_is_not_written_again_until_the_engine_runs_again":
        _LOCAL_BACKEND_FAULTS,
    "test_a_failure_that_cannot_be_stored_halts_and_a_resume_reverts": _LOCAL_BACKEND_FAULTS,
    **dict.fromkeys(
        ("test_an_interceptor_sees_every_execute_and_revert",
         "test_an_interceptor_can_make_a_call_twice",
         "test_async_methods_go_through_the_interceptor",
         "test_nothing_is_intercepted_once_the_block_ends"),
        "an interceptor runs around the calls of the process it is installed in; here the "
        "tasks run in worker processes (flowengine rehearse installs one in its own: "
        "tests/testkit/test_rehearse.py, tests/integration/test_rehearse_brokers.py)"),
    "test_a_retry_waiting_to_retry_is_reverted_not_retried":
        "a local engine's timer holds a retry's wait; a worker-based engine sends the next "
        "attempt's requests carrying it (tests/unit/test_wb_stop.py stops those)",
    "test_a_start_delay_is_armed_before_it_is_announced":
        "a local engine's own timer; a remote request is held by the broker client, by a clock "
        "of its own (test_a_suspended_start_delay_goes_on_with_what_is_left waits for the hold)",
}
#: Behaviour tests that fail on real brokers for an engine bug not fixed yet: name -> reason.
KNOWN_BUGS: dict[str, str] = {}


def behaviour_modules() -> list[ModuleType]:
    """Every ``tests/behaviour/test_*`` module."""
    return [importlib.import_module(f"{behaviour.__name__}.{info.name}")
            for info in pkgutil.iter_modules(behaviour.__path__)
            if info.name.startswith("test_")]


def behaviour_tests() -> dict[str, tuple[Callable[..., None], set[str]]]:
    """Each behaviour test function by name, with the names of its arguments."""
    found: dict[str, tuple[Callable[..., None], set[str]]] = {}
    for module in behaviour_modules():
        for name, test in vars(module).items():
            if name.startswith("test_") and inspect.isfunction(test):
                if name in found:  # a flat namespace here: names must stay unique
                    raise RuntimeError(f"behaviour test {name} is defined twice "
                                       f"({found[name][0].__module__}, {module.__name__})")
                found[name] = (test, set(inspect.signature(test).parameters))
    return found


def remote_copy(test: Callable[..., None]) -> Callable[..., None]:
    """``test`` under its own name, with marks of its own (added here, never to ``test``)."""
    @functools.wraps(test)
    def scenario(*args: Any, **kwargs: Any) -> None:
        test(*args, **kwargs)

    marks = list(getattr(test, "pytestmark", []))
    if test.__name__ in KNOWN_BUGS:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[test.__name__]).mark)
    scenario.pytestmark = marks  # type: ignore[attr-defined]
    return scenario


SCENARIOS = {name: remote_copy(test) for name, (test, params) in behaviour_tests().items()
             if name not in EXCLUDED and params & set(REMOTE_FIXTURES)}
# Collected by pytest as this module's own tests.
globals().update(SCENARIOS)


class RemoteSuite:
    """Worker processes on one broker, and how the scenarios reach them."""

    def __init__(self, broker: Broker, state_dir: Path) -> None:
        self.ledger = tasks.FileLedger(state_dir / "ledger.jsonl")
        self.barriers = tasks.FileBarriers(state_dir / "barriers")
        self.barriers.directory.mkdir()
        env = {tasks.LEDGER_ENV: str(self.ledger.path),
               tasks.BARRIERS_ENV: str(self.barriers.directory)}
        self.fleet = WorkerFleet(broker, unique_exchange("suite"), state_dir, env=env)
        # One task at a time, for the priority scenario: a one-thread worker of its own.
        self.single = WorkerFleet(broker, unique_exchange("suite-single"), state_dir, env=env)

    def start(self) -> None:
        served = [tasks.__name__, async_tasks.__name__]
        self.fleet.start(TOPIC, served, count=WORKERS, threads=THREADS)
        self.single.start(TOPIC, served, threads=1)

    def stop(self) -> None:
        self.fleet.stop_all()
        self.single.stop_all()

    def factory(self) -> EngineFactory:
        def options(fleet: WorkerFleet) -> dict[str, Any]:
            return fleet.engine_options(TOPIC, transition_timeout=TRANSITION_TIMEOUT)

        return EngineFactory("worker-based", options(self.fleet),
                             one_at_a_time=lambda: options(self.single),
                             task_threads=TASK_THREAD_PREFIX)


#: flowengine's own filesystem transport (the default, no server) joins the real brokers here.
FILESYSTEM = Broker("flowengine-fs", "flowengine-fs://")


@pytest.fixture(scope="module", params=[*sorted(BROKERS), FILESYSTEM.name])
def broker(request: pytest.FixtureRequest) -> Broker:
    """Each real broker in turn, then flowengine-fs (workers and engines meet in its default
    data folder; the suite's exchange keeps its queues apart)."""
    if request.param == FILESYSTEM.name:
        # Registers the URL scheme with kombu, for the harness's own connections.
        importlib.import_module("flowengine.worker_based.broker.transport_fs")
        return FILESYSTEM
    return require_broker(request.param)


@pytest.fixture(scope="module")
def remote_suite(broker: Broker, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[RemoteSuite]:
    suite = RemoteSuite(broker, tmp_path_factory.mktemp(f"suite-{broker.name}"))
    try:
        suite.start()
        yield suite
    finally:
        suite.stop()


@pytest.fixture
def engine_factory(remote_suite: RemoteSuite) -> Iterator[EngineFactory]:
    """A worker-based engine factory; the test process reads the workers' ledger."""
    remote_suite.ledger.clear()
    previous_ledger = tasks.use_ledger(remote_suite.ledger)
    previous_barriers = tasks.use_barriers(remote_suite.barriers)
    try:
        yield remote_suite.factory()
    finally:
        tasks.clear_barriers()
        tasks.use_barriers(previous_barriers)
        tasks.use_ledger(previous_ledger)


@pytest.fixture
def concurrent_engine_factory(engine_factory: EngineFactory) -> EngineFactory:
    """The same factory: two workers of several threads each run atoms at the same time."""
    return engine_factory


def test_every_engine_scenario_runs_here_or_is_excluded_with_a_reason() -> None:
    found = behaviour_tests()
    local = {name for name, (_test, params) in found.items() if "local_engine_factory" in params}
    assert local <= set(EXCLUDED), f"no reason given for: {local - set(EXCLUDED)}"
    assert set(EXCLUDED) <= set(found), f"EXCLUDED names no test: {set(EXCLUDED) - set(found)}"
    assert set(KNOWN_BUGS) <= set(SCENARIOS), "KNOWN_BUGS names a test that does not run here"
    assert len(SCENARIOS) > 100, sorted(SCENARIOS)  # the discovery found the suite


def test_both_worker_processes_ran_tasks(engine_factory: EngineFactory,
                                         remote_suite: RemoteSuite) -> None:
    # The scenarios would pass on one worker too. Here more atoms must meet than one worker
    # has threads (and may hold messages), so they can only meet on both workers.
    parties = WORKERS * THREADS
    tasks.make_barrier("everyone", parties)
    names = [f"m{i}" for i in range(parties)]
    engine_factory.run(test_parallel.meeting("everyone", names))
    assert sorted(tasks.names("passed-barrier")) == sorted(names)
    pids = {line["pid"] for line in remote_suite.ledger.lines() if line["event"] == "execute"}
    assert pids == {worker.pid for worker in remote_suite.fleet.workers}, pids
