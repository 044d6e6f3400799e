"""Repairing a flow its engine could not finish, on every engine: failed reverts run again,
an atom marked reverted on an operator's word, a flow run on from a failed execute; each
recorded in the flow's and the atoms' metadata and announced as an intervention."""

from __future__ import annotations

import contextlib
import os
import pathlib
from typing import Any

import pytest

from flowengine import states
from flowengine.engines import repair
from flowengine.engines import suspend_requests as sr
from flowengine.flows import linear_flow as lf
from flowengine.persistence.backends import impl_memory
from flowengine.utils import persistence_utils as p_utils

from . import tasks
from .harness import EngineFactory


class Stored:
    """A flow stored in a memory backend, loaded into engines of one kind again and again."""

    def __init__(self, factory: EngineFactory, flow: Any, **options: Any) -> None:
        self.factory, self.flow, self.options = factory, flow, options
        self.backend = impl_memory.MemoryBackend()
        self.detail = p_utils.create_flow_detail(flow, backend=self.backend)

    def engine(self) -> Any:
        return self.factory(self.flow, flow_detail=self.detail, backend=self.backend,
                            **self.options)


def fault_file(folder: pathlib.Path) -> pathlib.Path:
    """A fault file: the task guarded by it fails while it exists (a function, not a fixture:
    the suite also runs on real brokers, where fixtures of this package do not reach)."""
    path = folder / "fault"
    path.touch()
    return path


def _failing_revert(factory: EngineFactory, fault: pathlib.Path) -> Stored:
    """A ran, B's revert fails while ``fault`` exists, C failed: the flow ends FAILURE."""
    flow = lf.Flow("stuck").add(
        tasks.Step("A"), tasks.RevertFailsWhile("B", inject={"fault": str(fault)}),
        tasks.Fail("C"))
    stored = Stored(factory, flow)
    with pytest.raises(Exception):  # noqa: B017 - C's Boom and B's RevertBoom, wrapped or not
        stored.engine().run()
    assert stored.detail.state == states.FAILURE
    return stored


def _interventions(engine: Any) -> list[dict[str, Any]]:
    heard: list[dict[str, Any]] = []
    engine.interventions.register(engine.interventions.ANY,
                                  lambda kind, details: heard.append({"kind": kind, **details}))
    return heard


def test_failed_reverts_run_again_then_the_rest_in_order(engine_factory: EngineFactory,
                                                         tmp_path: pathlib.Path) -> None:
    fault = fault_file(tmp_path)
    stored = _failing_revert(engine_factory, fault)
    assert tasks.names("revert-failed") == ["B"]
    assert tasks.names("revert") == ["C"]
    fault.unlink()
    before = len(tasks.entries())

    engine = stored.engine()
    heard = _interventions(engine)
    engine.repair("retry-reverts", reason="the volume service is back", by="ops")
    with engine_factory.raises(tasks.Boom):  # a reverted flow raises what made it revert
        engine.run()

    done = tasks.entries()[before:]
    assert [(e["event"], e["atom"]) for e in done] == [("revert", "B"), ("revert", "A")]
    assert done[0]["result"] == "B-resource"  # what its execute returned, kept for it
    storage = engine.storage
    assert storage.get_flow_state() == states.REVERTED
    assert [storage.get_atom_state(n) for n in "ABC"] == [states.REVERTED] * 3
    [record] = storage.flow_meta[repair.META_REPAIRS]
    assert {k: record[k] for k in ("action", "atom", "reason", "by", "atoms")} == {
        "action": "retry-reverts", "atom": None, "reason": "the volume service is back",
        "by": "ops", "atoms": ["B"]}
    detail = storage.flow_detail.find(storage.get_atom_uuid("B"))
    assert detail.meta[repair.META_REPAIRS] == [record]
    assert [h["kind"] for h in heard] == ["repaired"]
    assert heard[0]["atoms"] == ["B"] and heard[0]["flow_uuid"] == storage.flow_uuid


def test_an_atom_marked_reverted_is_not_reverted_and_the_rest_are(
        engine_factory: EngineFactory, tmp_path: pathlib.Path) -> None:
    fault = fault_file(tmp_path)
    stored = _failing_revert(engine_factory, fault)
    before = len(tasks.entries())
    engine = stored.engine()
    engine.repair("mark-reverted", "B", reason="volume deleted by hand", by="ops")
    with engine_factory.raises(tasks.Boom):
        engine.run()
    assert [(e["event"], e["atom"]) for e in tasks.entries()[before:]] == [("revert", "A")]
    storage = engine.storage
    assert storage.get_flow_state() == states.REVERTED
    assert storage.get_atom_state("B") == states.REVERTED
    detail = storage.flow_detail.find(storage.get_atom_uuid("B"))
    [record] = detail.meta[repair.META_REPAIRS]
    assert (record["action"], record["atom"], record["reason"]) == (
        "mark-reverted", "B", "volume deleted by hand")


def test_a_flow_runs_on_from_its_failed_execute(engine_factory: EngineFactory,
                                               tmp_path: pathlib.Path) -> None:
    fault = tmp_path / "quota"
    fault.touch()
    flow = lf.Flow("halfway").add(tasks.Step("A"),
                                  tasks.FailWhile("B", inject={"fault": str(fault)}),
                                  tasks.Step("C"))
    stored = Stored(engine_factory, flow, never_resolve=True)  # stops without reverting
    with engine_factory.raises(tasks.Boom):
        stored.engine().run()
    assert stored.detail.state == states.FAILURE
    fault.unlink()
    engine = stored.engine()
    engine.repair("retry-from", "B", reason="quota raised", by="ops")
    engine.run()
    assert tasks.names("execute") == ["A", "B", "B", "C"]  # A's result kept: not run again
    assert engine.storage.get_flow_state() == states.SUCCESS
    [record] = engine.storage.flow_meta[repair.META_REPAIRS]
    assert record["atoms"] == ["B", "C"]


@pytest.mark.parametrize(("action", "atom", "match"), [
    ("retry-reverts", None, "is SUCCESS: retry-reverts repairs a FAILURE flow"),
    ("mark-reverted", "a", "is SUCCESS: mark-reverted repairs a FAILURE flow"),
    ("retry-from", "a", "is SUCCESS: retry-from repairs a FAILURE or REVERTED flow"),
])
def test_a_repair_that_does_not_fit_is_refused(engine_factory: EngineFactory, action: str,
                                               atom: str | None, match: str) -> None:
    stored = Stored(engine_factory, lf.Flow("fine").add(tasks.Step("a")))
    stored.engine().run()
    with pytest.raises(repair.RepairRefused, match=match):
        stored.engine().repair(action, atom, reason="why not")


def test_retry_from_an_atom_that_did_not_fail_is_refused(engine_factory: EngineFactory,
                                                         tmp_path: pathlib.Path) -> None:
    fault = fault_file(tmp_path)
    stored = _failing_revert(engine_factory, fault)
    with pytest.raises(repair.RepairRefused, match="revert of 'B' .* failed"):
        stored.engine().repair("retry-from", "C")
    fault.unlink()
    with pytest.raises(repair.RepairRefused, match="no atom 'Z'"):
        stored.engine().repair("mark-reverted", "Z", reason="gone")


def test_mark_reverted_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="mark-reverted needs a reason"):
        repair.Repair.now("mark-reverted", "B", reason=" ")


def test_a_flow_an_engine_still_holds_is_refused_naming_it(engine_factory: EngineFactory,
                                                           tmp_path: pathlib.Path) -> None:
    fault = fault_file(tmp_path)
    stored = _failing_revert(engine_factory, fault)
    with contextlib.closing(stored.backend.get_connection()) as conn:
        conn.change_flow_meta(stored.detail.uuid, lambda fd: fd.meta.update(
            {sr.META_RUNNING_ON: sr.running_on("SerialActionEngine")}))
    with pytest.raises(repair.RepairRefused,
                       match=rf"held by its SerialActionEngine in pid {os.getpid()} on "):
        repair.mark_reverted(stored.backend, stored.detail.uuid, "B", "gone", flow=stored.flow)
    assert tasks.names("revert") == ["C"]  # nothing more was done


def test_the_python_api_repairs_a_stored_flow(engine_factory: EngineFactory,
                                              tmp_path: pathlib.Path) -> None:
    fault = fault_file(tmp_path)
    stored = _failing_revert(engine_factory, fault)
    fault.unlink()
    engine = repair.retry_reverts(stored.backend, stored.detail.uuid, reason="fixed",
                                  by="ops", flow=stored.flow, engine=engine_factory.kind,
                                  **engine_factory.options)
    assert engine.storage.get_flow_state() == states.REVERTED
    assert tasks.names("revert")[-2:] == ["B", "A"]
    with contextlib.closing(stored.backend.get_connection()) as conn:
        meta = conn.get_flow_details(stored.detail.uuid).meta
    assert [r["action"] for r in meta[repair.META_REPAIRS]] == ["retry-reverts"]
