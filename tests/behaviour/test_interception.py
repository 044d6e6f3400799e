"""Interceptors (``flowengine.engines.interception``) see every task call, on every engine.

The worker-based engine's worker runs on a thread of this process, so one interceptor installed
here sees the calls of local and remote tasks alike: that is what lets ``flowengine.testing``
fail or repeat a call whichever engine makes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from flowengine import states
from flowengine.engines import interception
from flowengine.flows import linear_flow as lf

from . import async_tasks, tasks


class Recording(interception.Interceptor):
    """Keeps ``(action, atom)`` of each call; refuses the calls named in ``refuse``; makes the
    calls named in ``twice`` twice."""

    def __init__(self, refuse: tuple[str, str] | None = None,
                 twice: tuple[str, str] | None = None) -> None:
        self.seen: list[tuple[str, str]] = []
        self.refuse, self.twice = refuse, twice

    def around(self, call: interception.TaskCall, proceed: Callable[[], Any]) -> Any:
        key = (call.action, call.task.name)
        self.seen.append(key)
        if key == self.refuse:
            raise tasks.Boom(f"refused {call.task.name}")
        if key == self.twice:
            proceed()
        return proceed()

    async def around_async(self, call: interception.TaskCall,
                           proceed: Callable[[], Awaitable[Any]]) -> Any:
        self.seen.append((call.action, call.task.name))
        return await proceed()


def three_steps() -> lf.Flow:
    return lf.Flow("three").add(tasks.Step("a"), tasks.Step("b"), tasks.Step("c"))


def test_an_interceptor_sees_every_execute_and_revert(engine_factory) -> None:
    seen = Recording(refuse=("execute", "c"))
    engine = engine_factory(three_steps())
    with interception.installed(seen), engine_factory.raises(tasks.Boom, match="refused c"):
        engine.run()
    assert seen.seen[:3] == [("execute", "a"), ("execute", "b"), ("execute", "c")]
    assert seen.seen[3:] == [("revert", "c"), ("revert", "b"), ("revert", "a")]
    # The refused call never reached the task: its own execute left no ledger line.
    assert tasks.names("execute") == ["a", "b"]
    assert engine.storage.get_flow_state() == states.REVERTED


def test_an_interceptor_can_make_a_call_twice(engine_factory) -> None:
    seen = Recording(refuse=("execute", "c"), twice=("revert", "b"))
    engine = engine_factory(three_steps())
    with interception.installed(seen), engine_factory.raises(tasks.Boom):
        engine.run()
    assert tasks.names("revert") == ["c", "b", "b", "a"]


def test_async_methods_go_through_the_interceptor(engine_factory) -> None:
    seen = Recording()
    engine = engine_factory(lf.Flow("async").add(async_tasks.AsyncStep("one")))
    with interception.installed(seen):
        engine.run()
    assert seen.seen == [("execute", "one")]


def test_nothing_is_intercepted_once_the_block_ends(engine_factory) -> None:
    seen = Recording()
    with interception.installed(seen):
        pass
    engine_factory(three_steps()).run()
    assert seen.seen == []
