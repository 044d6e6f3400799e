"""An engine that cannot store an atom's state stops instead of running unrecorded work."""

from __future__ import annotations

from typing import Any

import pytest

from flowengine import engines, exceptions, states, task
from flowengine.flows import linear_flow as lf
from flowengine.persistence import base
from flowengine.persistence.backends import impl_memory

RAN: list[str] = []


class Step(task.Task):
    def execute(self) -> str:
        RAN.append(self.name)
        return self.name


class FailingConnection:
    """Wraps a real connection; atom writes fail once ``budget`` of them have succeeded."""

    def __init__(self, inner: base.Connection, budget: list[int]) -> None:
        self._inner = inner
        self._budget = budget

    def update_atom_details(self, atom_detail: Any) -> Any:
        if self._budget[0] <= 0:
            raise OSError("disk is read-only")
        self._budget[0] -= 1
        return self._inner.update_atom_details(atom_detail)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ReadOnlyLater(impl_memory.MemoryBackend):
    def __init__(self, writes_allowed: int) -> None:
        super().__init__()
        self.budget = [writes_allowed]

    def get_connection(self) -> Any:
        return FailingConnection(super().get_connection(), self.budget)


def test_engine_stops_when_a_running_state_cannot_be_stored() -> None:
    RAN.clear()
    backend = ReadOnlyLater(writes_allowed=2)  # a: RUNNING, SUCCESS; then b's RUNNING fails
    engine = engines.load(lf.Flow("f").add(Step("a"), Step("b"), Step("c")), backend=backend)
    with pytest.raises(exceptions.StorageFailure, match="'b'") as caught:
        engine.run()
    assert "read-only" in str(caught.value)
    assert RAN == ["a"], "b must not run: its RUNNING state was never stored"
    assert engine.storage.get_flow_state() == states.FAILURE
    # What was stored before the fault is still there.
    stored = {ad.name: ad.state for ad in backend.get_connection().get_atoms_for_flow(
        engine.storage.flow_uuid)}
    assert stored["a"] == states.SUCCESS
