"""A run stopped by KeyboardInterrupt or SystemExit leaves its flow RUNNING, as TaskFlow does.

The process stopping is not the flow failing: its records stay as they were, so a later engine
resumes it (TaskFlow's ``resume_many_flows`` example relies on this).
"""

from __future__ import annotations

import threading

import pytest

from flowengine import engines, states, task
from flowengine.flows import linear_flow
from flowengine.persistence.backends import impl_memory


class Once(task.Task):
    """Counts its runs."""

    def __init__(self, name: str, runs: list[str]) -> None:
        super().__init__(name=name)
        self._runs = runs

    def execute(self) -> int:
        self._runs.append(self.name)
        return 1


class Stops(task.Task):
    """Raises ``error`` (the process stopping) the first time, then succeeds."""

    def __init__(self, name: str, error: BaseException | None) -> None:
        super().__init__(name=name)
        self._error = error

    def execute(self) -> int:
        if self._error is not None:
            raise self._error
        return 2


def _flow(runs: list[str], error: BaseException | None) -> linear_flow.Flow:
    return linear_flow.Flow("interrupted").add(Once("first", runs), Stops("stops", error))


@pytest.mark.parametrize("kind", ["serial", "parallel"])
@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit()], ids=["ctrl-c", "exit"])
def test_an_interrupted_flow_stays_running_and_resumes(
        kind: str, error: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    # A parallel engine's pool thread ends with a task's SystemExit (futurist re-raises it
    # there once the future has it, as for TaskFlow). Heard here, not by pytest's hook, which
    # would report it against whichever test runs when the thread gets to it.
    thread_exits: list[type[BaseException]] = []
    thread_ended = threading.Event()

    def on_thread_exception(args: threading.ExceptHookArgs) -> None:
        thread_exits.append(args.exc_type)
        thread_ended.set()

    monkeypatch.setattr(threading, "excepthook", on_thread_exception)
    backend = impl_memory.MemoryBackend()
    runs: list[str] = []
    engine = engines.load(_flow(runs, error), engine=kind, backend=backend)
    with pytest.raises(type(error)):
        engine.run()
    if kind == "parallel" and isinstance(error, SystemExit):
        assert thread_ended.wait(10), "the pool thread did not end"
    assert thread_exits in ([], [SystemExit]), thread_exits
    detail = engine.storage.flow_detail
    stored = {fd.uuid: fd for lb in backend.get_connection().get_logbooks() for fd in lb}
    assert stored[detail.uuid].state == states.RUNNING
    assert {ad.name: ad.state for ad in stored[detail.uuid]} == {
        "first": states.SUCCESS, "stops": states.RUNNING}

    resumed = engines.load(_flow(runs, None), engine=kind, backend=backend,
                           flow_detail=stored[detail.uuid])
    resumed.run()
    assert resumed.storage.get_flow_state() == states.SUCCESS
    assert resumed.storage.get("stops") == 2
    assert runs == ["first"]
