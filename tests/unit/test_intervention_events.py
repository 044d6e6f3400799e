"""An operator's interventions in the event stream: ``flow-cancelled`` as a cancel is applied
and ``flow-repaired`` as a repair is made, from any engine's EventListener."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from flowengine import engines, exceptions, states, task
from flowengine.flows import linear_flow
from flowengine.persistence.backends import impl_memory
from flowengine.utils import persistence_utils as p_utils
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.event_listener import EventListener


class Sink(ext.EventSink):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event_type: str, **fields: object) -> None:
        self.events.append((event_type, dict(fields)))

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [fields for kind, fields in self.events if kind == event_type]


class Step(task.Task):
    def execute(self) -> str:
        return self.name


class UndoFails(task.Task):
    def execute(self, fault: str) -> str:
        return self.name

    def revert(self, fault: str, **kwargs: Any) -> None:
        if pathlib.Path(fault).exists():
            raise RuntimeError("cannot undo")


class Fail(task.Task):
    def execute(self) -> None:
        raise RuntimeError("fails")


def test_a_cancel_is_an_event_before_the_flows_end() -> None:
    engine = engines.load(linear_flow.Flow("cancelled").add(Step("a")))
    sink = Sink()
    engine.cancel("not needed", by="api")
    with EventListener(engine, sink), pytest.raises(exceptions.FlowCancelled):
        engine.run()
    [cancelled] = sink.of("flow-cancelled")
    assert {k: cancelled[k] for k in ("flow_uuid", "flow_name", "reason", "by")} == {
        "flow_uuid": engine.storage.flow_uuid, "flow_name": "cancelled",
        "reason": "not needed", "by": "api"}
    kinds = [kind for kind, _fields in sink.events if kind.startswith("flow-")]
    assert kinds == ["flow-started", "flow-cancelled", "flow-reverted"]


def test_a_repair_is_an_event(tmp_path: pathlib.Path) -> None:
    fault = tmp_path / "fault"
    fault.touch()
    flow = linear_flow.Flow("stuck").add(UndoFails("b", inject={"fault": str(fault)}),
                                         Fail("c"))
    backend = impl_memory.MemoryBackend()
    detail = p_utils.create_flow_detail(flow, backend=backend)
    with pytest.raises(Exception):  # noqa: B017 - the failure and the failed revert
        engines.load(flow, flow_detail=detail, backend=backend).run()
    fault.unlink()
    engine = engines.load(flow, flow_detail=detail, backend=backend)
    engine.repair("retry-reverts", reason="fixed", by="ops")
    sink = Sink()
    with EventListener(engine, sink), pytest.raises(RuntimeError):
        engine.run()
    [repaired] = sink.of("flow-repaired")
    assert {k: repaired[k] for k in ("action", "atom", "atoms", "reason", "by")} == {
        "action": "retry-reverts", "atom": None, "atoms": ["b"], "reason": "fixed", "by": "ops"}
    assert engine.storage.get_flow_state() == states.REVERTED
