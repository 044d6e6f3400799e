"""The task's context (:mod:`flowengine.context`), on every engine: inside ``execute`` and
``revert`` a task reads its flow, atom, attempt, request, worker and deadline, and logs with
them; outside a call it gets a detached context."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from manual_clock import ManualClock

from flowengine import context
from flowengine.flows import linear_flow as lf

from . import async_tasks, tasks
from .harness import EngineFactory


def _context_of(event: str, atom: str) -> dict[str, Any]:
    return [e for e in tasks.entries(event) if e["atom"] == atom][-1]["context"]


def test_execute_and_revert_read_who_and_what_they_are(engine_factory: EngineFactory) -> None:
    flow = lf.Flow("probed").add(tasks.ContextProbe("probe"), tasks.Fail("breaks"))
    engine = engine_factory(flow)
    with engine_factory.raises(tasks.Boom):
        engine.run()
    storage = engine.storage
    executed, reverted = _context_of("execute", "probe"), _context_of("revert", "probe")
    for ctx in (executed, reverted):
        assert ctx["flow_uuid"] == storage.flow_uuid
        assert ctx["flow_name"] == "probed"
        assert ctx["atom_name"] == "probe"
        assert ctx["atom_uuid"] == storage.get_atom_uuid("probe")
        assert ctx["attempt"] == 1 and ctx["request_attempt"] == 1
        assert ctx["deadline"] is None and ctx["cancel_requested"] is False
        if engine_factory.remote:
            assert ctx["worker"] and ctx["request_id"]
        else:
            assert ctx["worker"] is None and ctx["request_id"] is None
    assert (executed["action"], reverted["action"]) == ("execute", "revert")
    if engine_factory.remote:
        assert executed["request_id"] != reverted["request_id"]


def test_the_attempt_is_the_retry_controllers(engine_factory: EngineFactory) -> None:
    flow = lf.Flow("retried", retry=tasks.RecordingTimes(3, name="again", provides="attempt")
                   ).add(tasks.ContextProbe("probe"),
                         tasks.FailUntil("flaky", inject={"succeed_at": 2}))
    engine_factory.run(flow)
    attempts = [e["context"]["attempt"] for e in tasks.entries("execute")
                if e["atom"] == "probe"]
    assert attempts == [1, 2]


def test_the_deadline_is_in_every_call(engine_factory: EngineFactory) -> None:
    clock = ManualClock(start=5_000.0)
    engine_factory.run(lf.Flow("bounded").add(tasks.ContextProbe("probe")), deadline=60,
                       retry_clock=clock)
    assert _context_of("execute", "probe")["deadline"] == 5_060.0


def test_the_context_logger_carries_the_ids(engine_factory: EngineFactory) -> None:
    engine = engine_factory.run(lf.Flow("logged").add(tasks.ContextProbe("probe")))
    [logged] = tasks.entries("log")
    assert logged["message"] == "[logged/probe] probing probe"
    assert (logged["flow_uuid"], logged["flow_name"], logged["atom_name"], logged["action"],
            logged["attempt"]) == (engine.storage.flow_uuid, "logged", "probe", "execute", 1)


def test_the_default_context_logger_is_flowengine_task(
        caplog: pytest.LogCaptureFixture) -> None:
    ctx = context.TaskContext(flow_name="f", atom_name="a")
    with caplog.at_level(logging.INFO, logger=context.TASK_LOGGER):
        ctx.logger.info("hello %s", "there")
    [record] = caplog.records
    assert (record.name, record.getMessage()) == (context.TASK_LOGGER, "[f/a] hello there")


def test_outside_a_call_the_context_is_detached() -> None:
    ctx = context.current()
    assert ctx.flow_uuid is None and ctx.atom_name is None and ctx.action is None
    assert ctx.cancel_requested is False
    ctx.raise_if_cancelled()  # never raises
    assert ctx.wait(0) is False
    probe = tasks.ContextProbe("direct")
    assert probe.execute() == "direct"  # a task's execute still runs when called directly
    assert _context_of("execute", "direct")["flow_uuid"] is None


def test_a_detached_context_cannot_be_cancelled() -> None:
    ctx = context.current()
    assert ctx.signal.request("no") is False
    assert ctx.cancel_requested is False


def test_an_async_task_reads_its_context_after_an_await(engine_factory: EngineFactory) -> None:
    engine = engine_factory.run(lf.Flow("awaited").add(async_tasks.AsyncContextProbe("probe")))
    ctx = _context_of("execute", "probe")
    assert (ctx["flow_uuid"], ctx["atom_name"], ctx["action"]) == (
        engine.storage.flow_uuid, "probe", "execute")
    assert (ctx["worker"] is not None) == engine_factory.remote
