"""Engine hooks (flowengine.hooks): one ordered list through which the atom log, tracing and
an application's own additions attach to engines.

Every engine starts with the process's defaults (the atom log and tracing); the ``hooks`` option
replaces them. A hook is entered around each run, around each local task call on the thread that
runs it, and told how each failure was resolved; a hook that raises is logged and left out, and
the run goes on.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from wb_requester import TOPIC, WAIT, run_in_thread  # tests/ is on sys.path

from flowengine import engines, hooks, retry, states, task
from flowengine.flows import linear_flow
from flowengine.listeners.atoms import LOGGER_NAME, AtomLogHook
from flowengine.tracing import TracingHook
from flowengine.worker_based import worker as wk
from flowengine.worker_based.event_listener import EventHook
from flowengine.worker_based.extensions import EventSink


class Spy(hooks.Hook):
    """Writes down every point it is called at, in one log shared with other spies."""

    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name, self.log = name, log

    @contextlib.contextmanager
    def _around_run(self, engine: Any) -> Iterator[None]:
        self.log.append((self.name, "enter", engine.storage.get_flow_state()))
        try:
            yield
        finally:
            self.log.append((self.name, "exit", engine.storage.get_flow_state()))

    def run(self, engine: Any) -> contextlib.AbstractContextManager[None]:
        return self._around_run(engine)

    @contextlib.contextmanager
    def _around_call(self, atom: Any) -> Iterator[None]:
        self.log.append((self.name, "call", atom.name, threading.current_thread().name))
        yield

    def call(self, atom: Any) -> contextlib.AbstractContextManager[None]:
        return self._around_call(atom)

    def failure_resolved(self, atom_uuid: str, decision: object, retry: Any) -> None:
        self.log.append((self.name, "resolved", atom_uuid, str(decision),
                         None if retry is None else retry.name))


class Broken(hooks.Hook):
    def run(self, engine: Any) -> None:
        raise RuntimeError("hook broken at run")

    def call(self, atom: Any) -> None:
        raise RuntimeError("hook broken at call")

    def failure_resolved(self, atom_uuid: str, decision: object, retry: Any) -> None:
        raise RuntimeError("hook broken at resolution")


def _retried_flow() -> tuple[linear_flow.Flow, list[int]]:
    """A flow whose task fails its first call; the list counts its calls."""
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first time")
        return "ok"

    flow = linear_flow.Flow("retried", retry=retry.Times(2, name="r"))
    return flow.add(task.FunctorTask(flaky, name="flaky")), calls


def test_every_engine_starts_with_the_atom_log_and_tracing() -> None:
    assert [type(hook) for hook in hooks.defaults] == [AtomLogHook, TracingHook]
    for kind in ("serial", "parallel"):
        engine = engines.load(task.FunctorTask(lambda: None), engine=kind)
        assert [type(hook) for hook in engine.hooks] == [AtomLogHook, TracingHook]


def test_the_worker_based_engine_attaches_its_records_and_events_as_hooks_too() -> None:
    def kinds(**options: Any) -> list[str]:
        engine = engines.load(task.FunctorTask(lambda: None), engine="worker-based",
                              transport="memory", **options)
        return [type(hook).__name__ for hook in engine.hooks]

    # After the hooks it was given: where each task ran, then events and metrics when on.
    assert kinds() == ["AtomLogHook", "TracingHook", "_Placement", "EventHook"]
    assert kinds(events=False, hooks=[]) == ["_Placement"]
    assert kinds(metrics=True) == ["AtomLogHook", "TracingHook", "_Placement", "EventHook",
                                   "EventHook"]


class WholeSpy(Spy):
    """A spy entered around the whole of each run only."""

    def whole_run(self, engine: Any) -> contextlib.AbstractContextManager[None]:
        return self._around_run(engine)

    def run(self, engine: Any) -> None:
        return None


def test_a_whole_run_hook_is_entered_before_set_up_and_left_after_the_end_state() -> None:
    log: list[tuple[Any, ...]] = []
    flow, _flaky = _retried_flow()
    engine = engines.load(flow, hooks=[Spy("run", log), WholeSpy("whole", log)])
    engine.run()
    points = [entry[:2] for entry in log if entry[1] in ("enter", "exit")]
    # Entered first though it is listed last: the whole run holds the run.
    assert points == [("whole", "enter"), ("run", "enter"), ("run", "exit"), ("whole", "exit")]
    # Outside: before the flow was prepared (still PENDING) and after SUCCESS was stored.
    assert log[0] == ("whole", "enter", states.PENDING)
    assert log[-1] == ("whole", "exit", states.SUCCESS)


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_hooks_are_entered_in_order_around_each_run_call_and_resolution(kind: str) -> None:
    log: list[tuple[Any, ...]] = []
    flow, _flaky = _retried_flow()
    engine = engines.load(flow, engine=kind, hooks=[Spy("first", log), Spy("second", log)])
    engine.run()
    uuid = engine.storage.get_atom_uuid("flaky")
    points = [entry[:2] for entry in log]
    assert points[:2] == [("first", "enter"), ("second", "enter")]
    assert points[-2:] == [("second", "exit"), ("first", "exit")]
    # Left once the atoms are done; the end state is stored just after.
    assert log[-1] == ("first", "exit", states.RUNNING)
    assert engine.storage.get_flow_state() == states.SUCCESS
    calls = [entry for entry in log if entry[1] == "call"]
    # execute (fails), revert, execute again: each call within both hooks, in order.
    assert [c[:3] for c in calls] == [("first", "call", "flaky"), ("second", "call", "flaky")] * 3
    # Entered where the call runs: the engine's thread (serial) or a pool thread.
    engine_thread = threading.current_thread().name
    assert all((c[3] == engine_thread) == (kind == "serial") for c in calls)
    resolved = [entry for entry in log if entry[1] == "resolved"]
    assert resolved == [("first", "resolved", uuid, str(retry.RETRY), "r"),
                        ("second", "resolved", uuid, str(retry.RETRY), "r")]


def test_a_hook_that_raises_is_logged_and_left_out(caplog: pytest.LogCaptureFixture) -> None:
    log: list[tuple[Any, ...]] = []
    flow, flaky = _retried_flow()
    engine = engines.load(flow, hooks=[Broken(), Spy("spy", log)])
    with caplog.at_level(logging.ERROR, logger="flowengine.hooks"):
        engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS and len(flaky) == 2
    assert ("spy", "exit", states.RUNNING) in log  # the others still ran
    messages = [r.getMessage() for r in caplog.records]
    assert any("failed as a run of flow 'retried' started" in m for m in messages)
    assert any("failed around a call of task 'flaky'" in m for m in messages)
    assert any("failed on the resolution" in m for m in messages)


def test_without_hooks_nothing_attaches(caplog: pytest.LogCaptureFixture) -> None:
    flow, _flaky = _retried_flow()
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        engines.run(flow, hooks=[])
    assert [r for r in caplog.records if r.name == LOGGER_NAME] == []
    flow, _flaky = _retried_flow()
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        engines.run(flow)  # the defaults: the atom log says what happened
    assert any(r.name == LOGGER_NAME for r in caplog.records)


def test_an_engines_list_can_change_before_it_runs() -> None:
    log: list[tuple[Any, ...]] = []
    flow, _flaky = _retried_flow()
    engine = engines.load(flow)
    atom_log = next(hook for hook in engine.hooks if isinstance(hook, AtomLogHook))
    engine.hooks.remove(atom_log)
    engine.hooks.insert(0, Spy("mine", log))
    engine.run()
    assert [type(hook) for hook in engine.hooks] == [Spy, TracingHook]
    assert ("mine", "exit", states.RUNNING) in log
    assert [type(hook) for hook in hooks.defaults] == [AtomLogHook, TracingHook]  # untouched


def test_a_hook_must_be_a_hook() -> None:
    with pytest.raises(ValueError, match="must hold flowengine.hooks.Hook objects, not 'log'"):
        engines.load(task.FunctorTask(lambda: None), hooks=["log"])
    with pytest.raises(ValueError, match="must be a list of flowengine.hooks.Hook"):
        engines.load(task.FunctorTask(lambda: None), hooks="log")
    with pytest.raises(TypeError, match="must be a flowengine.hooks.Hook, not 3"):
        hooks.Hooks().append(3)  # type: ignore[arg-type]


class Collected(EventSink):
    """Keeps every event it is sent, by type."""

    def __init__(self) -> None:
        self.types: list[str] = []

    def emit(self, event_type: str, **fields: object) -> None:
        self.types.append(event_type)


def test_events_attach_to_a_local_engine_as_a_hook_and_hear_the_end_state() -> None:
    sink = Collected()
    flow = linear_flow.Flow("sent").add(task.FunctorTask(lambda: None, name="a"))
    engines.run(flow, hooks=[*hooks.defaults, EventHook(sink)])
    assert sink.types == ["flow-started", "task-started", "task-succeeded", "flow-succeeded"]


class Sends(hooks.Hook):
    """Writes down each request a worker-based engine sends, and adds a header to it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, str, bool]] = []

    def request_sent(self, headers: Any, atom_uuid: str, *, request_id: str, attempt: int,
                     task_name: str, topic: str) -> None:
        headers["x-spy"] = request_id
        self.sent.append((task_name, attempt, topic, len(request_id) == 32))


class BrokenSend(hooks.Hook):
    def request_sent(self, headers: Any, atom_uuid: str, **_details: Any) -> None:
        raise RuntimeError("hook broken at send")


class Echo(task.Task):
    def execute(self) -> str:
        return self.name


def _run_on_a_worker(worker: wk.Worker, exchange: str, caplog: pytest.LogCaptureFixture,
                     engine_hooks: list[hooks.Hook]) -> Any:
    """Run tasks ``a`` and ``b`` on ``worker`` (in a thread) with ``engine_hooks``; the engine,
    once the worker has stopped. The hooks' errors are captured in ``caplog``."""
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    try:
        engine = engines.load(linear_flow.Flow("two").add(Echo("a"), Echo("b")),
                              engine="worker-based", exchange=exchange, topics=[TOPIC],
                              transport="memory", transition_timeout=WAIT, hooks=engine_hooks)
        with caplog.at_level(logging.ERROR, logger="flowengine.hooks"):
            engine.run()
    finally:
        worker.stop(grace=WAIT)
        thread.join(WAIT)
    return engine


def test_a_worker_based_engine_tells_its_hooks_of_each_request_it_sends(
        exchange: str, caplog: pytest.LogCaptureFixture) -> None:
    worker = wk.Worker(exchange, TOPIC, [Echo], events=False, transport="memory")
    spy = Sends()
    engine = _run_on_a_worker(worker, exchange, caplog, [BrokenSend(), spy])
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert spy.sent == [("a", 1, TOPIC, True), ("b", 1, TOPIC, True)]
    assert sum("BrokenSend" in r.getMessage() and "request goes without it" in r.getMessage()
               for r in caplog.records) == 2


class Serves(hooks.Hook):
    """Writes down, on a worker, each request served and the replies sent while serving it."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []

    @contextlib.contextmanager
    def _around(self, headers: Any, details: dict[str, Any]) -> Iterator[None]:
        self.log.append(("serve", details["task_name"], details["attempt"],
                         details["topic"], headers.get("x-spy") == details["request_id"]))
        yield
        self.log.append(("served", details["task_name"]))

    def serving(self, headers: Any, **details: Any) -> contextlib.AbstractContextManager[None]:
        return self._around(headers, details)

    def replying(self, state: str, event_type: str | None) -> None:
        self.log.append(("reply", state))


class BrokenServe(hooks.Hook):
    def serving(self, headers: Any, **_details: Any) -> None:
        raise RuntimeError("hook broken at serving")

    def replying(self, state: str, event_type: str | None) -> None:
        raise RuntimeError("hook broken at reply")


def test_a_worker_starts_with_the_process_defaults_and_can_be_given_its_own(
        exchange: str) -> None:
    given = Serves()
    default = wk.Worker(exchange, TOPIC, [Echo], events=False, transport="memory")
    own = wk.Worker(exchange, TOPIC, [Echo], events=False, transport="memory", hooks=[given])
    assert [type(h) for h in default.hooks] == [type(h) for h in hooks.defaults]
    assert any(isinstance(h, TracingHook) for h in default.hooks)
    assert list(own.hooks) == [given]


def test_a_worker_tells_its_hooks_of_each_request_it_serves_and_each_reply(
        exchange: str, caplog: pytest.LogCaptureFixture) -> None:
    spy = Serves()
    worker = wk.Worker(exchange, TOPIC, [Echo], events=False, transport="memory",
                       hooks=[BrokenServe(), spy])
    engine = _run_on_a_worker(worker, exchange, caplog, [Sends()])
    assert engine.storage.get_flow_state() == states.SUCCESS
    # Each request's replies are told inside its serving; the request ids are the engine's.
    # (A task this worker saw end quickly may start without a RUNNING reply: protocol 2.)
    running = spy.log.count(("reply", "RUNNING"))
    assert [entry for entry in spy.log if entry != ("reply", "RUNNING")] == [
        ("serve", "a", 1, TOPIC, True), ("reply", "SUCCESS"), ("served", "a"),
        ("serve", "b", 1, TOPIC, True), ("reply", "SUCCESS"), ("served", "b"),
    ]
    assert spy.log[1] == ("reply", "RUNNING")  # the first run of a task is always announced
    messages = [r.getMessage() for r in caplog.records]
    assert sum("BrokenServe" in m and "served without it" in m for m in messages) == 2
    assert sum("BrokenServe" in m and "reply goes without it" in m for m in messages) == (
        2 + running)
