"""The behaviour suite's scenarios, on real brokers, with tasks in worker processes.

The scenarios are the very functions of ``tests/behaviour`` (a representative subset: arguments,
patterns, deciders, retries, revert order, notifications, progress, suspend and resume,
concurrency, flows refused before they run). Each gets an engine factory whose engines reach two
``flowengine worker`` processes over Redis or RabbitMQ. The atoms write to a
:class:`~behaviour.tasks.FileLedger` and meet at :class:`~behaviour.tasks.FileBarriers`, which the
worker processes find through the environment, so the scenarios' assertions read what the
workers did exactly as they read it in-process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from behaviour import (
    tasks,
    test_arguments,
    test_bad_input,
    test_deciders,
    test_notifications,
    test_parallel,
    test_patterns,
    test_retry,
    test_retry_delay,
    test_revert,
    test_suspend_resume,
)
from behaviour.harness import EngineFactory
from wbe_harness import Broker, WorkerFleet, unique_exchange

from flowengine.deciders import Depth

pytestmark = pytest.mark.integration

TOPIC = "suite"
#: Two workers, each with enough threads for the widest concurrent scenario (four atoms).
WORKERS, THREADS = 2, 4
#: Seconds a request may wait to be taken; the workers are up before any scenario starts.
TRANSITION_TIMEOUT = 15.0


def scenario(test: Callable[..., None], **params: Any) -> Any:
    label = ",".join(f"{k}={getattr(v, 'name', v)}" for k, v in params.items())
    return pytest.param(test, params, id=test.__name__ + (f"[{label}]" if label else ""))


SCENARIOS = [
    # patterns and arguments
    scenario(test_patterns.test_linear_flow_runs_children_in_order),
    scenario(test_patterns.test_graph_flow_diamond),
    scenario(test_patterns.test_nested_flows_see_outer_results_and_outer_sees_inner),
    scenario(test_patterns.test_engines_run_returns_everything_stored),
    scenario(test_patterns.test_ready_atoms_start_in_priority_order),
    scenario(test_arguments.test_rebind_dict_maps_arguments_to_other_names),
    scenario(test_arguments.test_tuple_provides_feed_separate_consumers),
    scenario(test_arguments.test_optional_argument_uses_its_default_when_nothing_provides_it),
    scenario(test_arguments.test_inject_works_whether_transient_or_stored, transient=False),
    # deciders
    scenario(test_deciders.test_each_depth_ignores_its_reach_and_runs_the_rest,
             depth=Depth.FLOW, ignored={"b", "c", "d"}),
    scenario(test_deciders.test_decider_sees_the_results_of_its_link_source),
    # retries
    scenario(test_retry.test_times_retries_until_the_subflow_succeeds),
    scenario(test_retry.test_nested_times_revert_or_revert_all, revert_all=False),
    scenario(test_retry.test_for_each_nested_inside_for_each),
    scenario(test_retry_delay.test_attempts_happen_in_order_each_after_its_wait),
    # reverts
    scenario(test_revert.test_linear_flow_reverts_in_reverse_order_of_execution),
    scenario(test_revert.test_graph_flow_reverts_dependents_before_their_providers),
    scenario(test_revert.test_revert_receives_failure_objects),
    scenario(test_revert.test_revert_failure_stops_reverting_and_raises_the_revert_error),
    scenario(test_revert.test_two_failures_in_one_batch_raise_wrapped_failure),
    # notifications and progress
    scenario(test_notifications.test_failing_flow_notification_order),
    scenario(test_notifications.test_progress_is_stored_and_reaches_task_listeners),
    scenario(test_notifications.test_progress_of_a_failed_task_is_kept),
    # suspend and resume
    scenario(test_suspend_resume.test_sending_true_suspends_after_running_atoms_finish),
    scenario(test_suspend_resume.test_suspend_while_reverting_then_finish_reverting),
    scenario(test_suspend_resume.test_suspend_inside_a_retry_then_resume),
    scenario(test_suspend_resume.test_a_new_engine_resumes_from_the_flow_detail),
    # concurrency across processes
    scenario(test_parallel.test_independent_atoms_run_at_the_same_time),
    scenario(test_parallel.test_one_failure_while_others_run_reverts_them_all),
    # bad input
    scenario(test_bad_input.test_missing_dependency_names_the_atom_and_the_name),
    scenario(test_bad_input.test_result_shape_mismatch_fails_the_atom_and_reverts,
             provides=("a", "b"), value=[1]),
]


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
        self.fleet.start(TOPIC, [tasks.__name__], count=WORKERS, threads=THREADS)
        self.single.start(TOPIC, [tasks.__name__], threads=1)

    def stop(self) -> None:
        self.fleet.stop_all()
        self.single.stop_all()

    def factory(self) -> EngineFactory:
        def options(fleet: WorkerFleet) -> dict[str, Any]:
            return fleet.engine_options(TOPIC, transition_timeout=TRANSITION_TIMEOUT)

        return EngineFactory("worker-based", options(self.fleet),
                             one_at_a_time=lambda: options(self.single))


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
def remote_factory(remote_suite: RemoteSuite) -> Iterator[EngineFactory]:
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


@pytest.mark.parametrize(("test", "params"), SCENARIOS)
def test_scenario(remote_factory: EngineFactory, test: Callable[..., None],
                  params: dict[str, Any]) -> None:
    test(remote_factory, **params)


def test_both_worker_processes_ran_tasks(remote_factory: EngineFactory,
                                         remote_suite: RemoteSuite) -> None:
    # The scenarios above would pass on one worker too. Here more atoms must meet than one
    # worker has threads (and may hold messages), so they can only meet on both workers.
    parties = WORKERS * THREADS
    tasks.make_barrier("everyone", parties)
    names = [f"m{i}" for i in range(parties)]
    remote_factory.run(test_parallel.meeting("everyone", names))
    assert sorted(tasks.names("passed-barrier")) == sorted(names)
    pids = {line["pid"] for line in remote_suite.ledger.lines() if line["event"] == "execute"}
    assert pids == {worker.pid for worker in remote_suite.fleet.workers}, pids
