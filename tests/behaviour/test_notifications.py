"""Flow and atom notifications, task progress, and engine statistics."""

from __future__ import annotations

from flowengine import retry, states
from flowengine.flows import linear_flow as lf
from flowengine.task import EVENT_UPDATE_PROGRESS
from flowengine.types.failure import Failure

from . import tasks


class Events:
    """Flow and atom notifications of one engine, in one list, in order."""

    def __init__(self, engine) -> None:
        self.all: list[tuple] = []
        self.details: list[tuple[str, str, dict]] = []
        engine.notifier.register("*", self._on_flow)
        engine.atom_notifier.register("*", self._on_atom)

    def _on_flow(self, state, details):
        self.all.append(("flow", state))
        self.details.append(("flow", state, details))

    def _on_atom(self, state, details):
        name = details.get("task_name") or details.get("retry_name")
        self.all.append((name, state))
        self.details.append((name, state, details))

    def of(self, name: str) -> list[str]:
        return [state for who, state in self.all if who == name]


def test_successful_linear_flow_notification_order(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Step("b")))
    events = Events(engine)
    engine.run()
    assert events.all == [
        ("flow", states.RUNNING),
        ("a", states.RUNNING), ("a", states.SUCCESS),
        ("b", states.RUNNING), ("b", states.SUCCESS),
        ("flow", states.SUCCESS),
    ]


def test_failing_flow_notification_order(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Fail("boom")))
    events = Events(engine)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert events.all == [
        ("flow", states.RUNNING),
        ("a", states.RUNNING), ("a", states.SUCCESS),
        ("boom", states.RUNNING), ("boom", states.FAILURE),
        ("boom", states.REVERTING), ("boom", states.REVERTED),
        ("a", states.REVERTING), ("a", states.REVERTED),
        ("flow", states.REVERTED),
    ]


def test_retry_notification_order(engine_factory):
    flow = lf.Flow("f", retry=retry.Times(2, name="r", provides="attempt")).add(
        tasks.FailUntil("flaky", inject={"succeed_at": 2}))
    engine = engine_factory(flow)
    events = Events(engine)
    engine.run()
    assert events.of("r") == [states.RUNNING, states.SUCCESS, states.RETRYING,
                              states.RUNNING, states.SUCCESS]
    assert events.of("flaky") == [states.RUNNING, states.FAILURE, states.REVERTING,
                                  states.REVERTED, states.PENDING, states.RUNNING,
                                  states.SUCCESS]
    # The subflow is reset to PENDING only once the retry decided to retry.
    assert events.all.index(("r", states.RETRYING)) < events.all.index(
        ("flaky", states.PENDING))


def test_suspended_flow_notifications(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Step("b")))
    events = Events(engine)
    engine.atom_notifier.register(states.SUCCESS, lambda state, details: engine.suspend())
    engine.run()
    assert [s for who, s in events.all if who == "flow"] == [
        states.RUNNING, states.SUSPENDING, states.SUSPENDED]


def test_atom_notification_details(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Constant("c", inject={"value": 7})))
    events = Events(engine)
    engine.run()
    running, success = [d for who, _state, d in events.details if who == "c"]
    uuid = engine.storage.get_atom_uuid("c")
    assert running["task_uuid"] == success["task_uuid"] == uuid
    assert running["old_state"] == states.PENDING
    assert success["old_state"] == states.RUNNING
    assert success["result"] == 7
    assert "result" not in running


def test_failure_notification_carries_the_failure(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Fail("boom")))
    events = Events(engine)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    [failed] = [d for who, state, d in events.details if state == states.FAILURE]
    assert isinstance(failed["result"], Failure) and failed["result"].check(tasks.Boom)


def test_retry_notification_details(engine_factory):
    flow = lf.Flow("f", retry=retry.Times(1, name="r")).add(tasks.Step("a"))
    engine = engine_factory(flow)
    events = Events(engine)
    engine.run()
    [first, *_] = [d for who, _s, d in events.details if who == "r"]
    assert first["retry_name"] == "r"
    assert first["retry_uuid"] == engine.storage.get_atom_uuid("r")


def test_flow_notification_details(engine_factory):
    engine = engine_factory(lf.Flow("named-flow").add(tasks.Step("a")))
    events = Events(engine)
    engine.run()
    running, success = [d for who, _s, d in events.details if who == "flow"]
    assert running["flow_name"] == "named-flow"
    assert running["flow_uuid"] == engine.storage.flow_uuid
    assert running["engine"] is engine
    assert success["old_state"] == states.RUNNING


def test_listener_for_one_state_hears_only_that_state(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Step("b")))
    heard = []
    engine.atom_notifier.register(states.SUCCESS,
                                  lambda state, details: heard.append((state, details["result"])))
    engine.run()
    assert heard == [(states.SUCCESS, "a"), (states.SUCCESS, "b")]


def test_a_raising_listener_does_not_break_the_run(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Step("b")))

    def broken(state, details):
        raise RuntimeError("listener bug")

    engine.atom_notifier.register("*", broken)
    engine.notifier.register("*", broken)
    engine.run()
    assert tasks.names("execute") == ["a", "b"]
    assert engine.storage.get_flow_state() == states.SUCCESS


# ---- progress -----------------------------------------------------------------------------------


def test_progress_is_stored_and_reaches_task_listeners(engine_factory):
    progress_task = tasks.Progress("p")
    heard = []
    progress_task.notifier.register(
        EVENT_UPDATE_PROGRESS, lambda event, details: heard.append(details["progress"]))
    engine = engine_factory(lf.Flow("f").add(progress_task))
    stored = []
    engine.atom_notifier.register(
        states.SUCCESS, lambda state, details: stored.append(engine.storage.get_task_progress("p")))
    engine.run()
    assert heard == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert stored == [1.0]
    assert engine.storage.get_task_progress("p") == 1.0


def test_a_tasks_own_events_reach_its_listeners(engine_factory):
    # As TaskFlow's workers do, a worker sends every event the task notifies, not only progress.
    announcer = tasks.Announcer("a")
    heard = []
    # A task's notifier takes callbacks for its declared events and for ANY (as TaskFlow's).
    announcer.notifier.register(announcer.notifier.ANY, lambda event, details: heard.append(
        details["count"]) if event == "found" else None)
    engine_factory.run(announcer)
    assert heard == [1, 2]


def test_progress_is_clamped(engine_factory):
    heard = []
    wild = tasks.WildProgress("wild")
    wild.notifier.register(EVENT_UPDATE_PROGRESS,
                           lambda event, details: heard.append(details["progress"]))
    engine_factory.run(wild)
    assert heard == [0.0, 1.0, 0.0, 1.0]


def test_progress_of_a_failed_task_is_kept(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.HalfThenFail("half")))
    progress_seen = []
    engine.atom_notifier.register(
        states.FAILURE,
        lambda state, details: progress_seen.append(engine.storage.get_task_progress("half")))
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert progress_seen == [0.5]


# ---- statistics ---------------------------------------------------------------------------------


STATISTICS_KEYS = {"active_for", "awaiting", "completed", "discarded_failures", "incomplete",
                   "seconds_per_state"}


def test_statistics_keys_and_counters(engine_factory):
    engine = engine_factory.run(lf.Flow("f").add(*(tasks.Step(f"s{i}") for i in range(3))))
    stats = engine.statistics
    assert set(stats) == STATISTICS_KEYS
    assert set(stats["seconds_per_state"]) == {"analyzing", "resuming", "scheduling", "waiting"}
    assert stats["completed"] == 3
    assert stats["discarded_failures"] == 0
    assert stats["awaiting"] == 0
    assert stats["active_for"] > 0


def test_statistics_after_a_revert_count_reverts_and_failures(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Fail("boom")))
    with engine_factory.raises(tasks.Boom):
        engine.run()
    stats = engine.statistics
    # a and boom executed, then both reverted: four completions; boom's failure was handled.
    assert stats["completed"] == 4
    assert stats["discarded_failures"] == 1


def test_nothing_is_left_incomplete_after_a_run(engine_factory):
    engine = engine_factory.run(lf.Flow("f").add(tasks.Step("a"), tasks.Step("b")))
    assert engine.statistics["incomplete"] == 0
