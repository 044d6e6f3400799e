"""Attempt ids stored with the atom (issue 14, item 7), over the in-process worker.

The worker-based engine stores the id of each atom's request in the same write as the
``RUNNING`` state that starts it, and a run that finds atoms stored in flight (their process
died) asks the workers not to run those ids before it sends the atoms again.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowengine import engines, states
from flowengine.engines.actions import META_ATTEMPT_IDS
from flowengine.flows import linear_flow
from flowengine.persistence import backends
from flowengine.storage import Storage
from flowengine.utils import persistence_utils as p_utils
from flowengine.worker_based import executor as wex

from . import tasks
from .harness import InProcessWorker


def _flow() -> linear_flow.Flow:
    return linear_flow.Flow("ids").add(tasks.ContextProbe("a"), tasks.ContextProbe("b"))


def _spy_revokes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The request ids each worker-based executor is asked to revoke as it starts."""
    revoked: list[list[str]] = []
    revoke = wex.WorkerTaskExecutor.revoke_at_start

    def spy(self: wex.WorkerTaskExecutor, request_ids: Any) -> None:
        revoked.append(list(request_ids))
        revoke(self, request_ids)

    monkeypatch.setattr(wex.WorkerTaskExecutor, "revoke_at_start", spy)
    return revoked


def test_the_request_id_is_stored_with_the_running_state_in_one_write(
    behaviour_worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[tuple[str, str, Any]] = []
    set_state = Storage.set_atom_state
    update_meta = Storage.update_atom_metadata

    def spy_state(self: Storage, name: str, state: str, progress: float | None = None,
                  meta: Any = None) -> None:
        writes.append(("state", state, dict(meta or {})))
        set_state(self, name, state, progress=progress, meta=meta)

    def spy_meta(self: Storage, name: str, update: Any) -> None:
        writes.append(("meta", name, dict(update)))
        update_meta(self, name, update)

    monkeypatch.setattr(Storage, "set_atom_state", spy_state)
    monkeypatch.setattr(Storage, "update_atom_metadata", spy_meta)
    engine = engines.load(_flow(), engine="worker-based", **behaviour_worker.engine_options())
    engine.run()
    # The id of the request each task ran under, as its worker set it in the task's context.
    sent = {e["atom"]: e["context"]["request_id"] for e in tasks.entries("execute")}

    running = [meta for kind, state, meta in writes if kind == "state" and state == states.RUNNING]
    assert [meta[META_ATTEMPT_IDS] for meta in running] == [[sent["a"]], [sent["b"]]]
    assert not [u for kind, _n, u in writes if kind == "meta" and META_ATTEMPT_IDS in u]
    for name in ("a", "b"):
        detail = engine.storage.flow_detail.find(engine.storage.get_atom_uuid(name))
        assert detail.meta[META_ATTEMPT_IDS] == [sent[name]]


def test_a_local_engine_stores_no_request_ids() -> None:
    engine = engines.load(_flow(), engine="serial")
    engine.run()
    detail = engine.storage.flow_detail.find(engine.storage.get_atom_uuid("a"))
    assert META_ATTEMPT_IDS not in detail.meta


def test_a_run_revokes_what_a_dead_predecessor_left_in_flight(
    behaviour_worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = backends.fetch("memory://")
    flow = _flow()
    detail = p_utils.create_flow_detail(flow, backend=backend)
    first = engines.load(flow, flow_detail=detail, backend=backend, engine="serial")
    first.prepare()
    # As a killed engine leaves it: "a" stored RUNNING with the id of the request it sent.
    first.storage.set_atom_state("a", states.RUNNING, meta={META_ATTEMPT_IDS: ["dead-a"]})
    revoked = _spy_revokes(monkeypatch)

    resumed = engines.load(_flow(), flow_detail=detail, backend=backend, engine="worker-based",
                           **behaviour_worker.engine_options())
    resumed.run()

    assert revoked == [["dead-a"]]
    assert resumed.storage.get_flow_state() == states.SUCCESS
    stored = resumed.storage.flow_detail.find(resumed.storage.get_atom_uuid("a"))
    assert stored.meta[META_ATTEMPT_IDS] != ["dead-a"]  # the new attempt's id replaced it


def test_a_run_after_a_clean_end_revokes_nothing(
    behaviour_worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    revoked = _spy_revokes(monkeypatch)
    engine = engines.load(_flow(), engine="worker-based", **behaviour_worker.engine_options())
    engine.run()
    engine.reset()
    engine.run()
    assert revoked == []


def test_an_attempt_sent_again_is_stored_with_the_first(
    behaviour_worker: InProcessWorker,
) -> None:
    engine = engines.load(_flow(), engine="worker-based", **behaviour_worker.engine_options())
    engine.prepare()
    storage = engine.storage
    storage.set_atom_state("a", states.RUNNING, meta={META_ATTEMPT_IDS: ["first"]})
    events = engine.worker_executor.events  # what the executor reports each request sent to
    uuid = storage.get_atom_uuid("a")

    events.emit("task-sent", atom_uuid=uuid, request_id="first", attempt=1, action="execute")
    events.emit("task-sent", atom_uuid=uuid, request_id="again", attempt=2, action="execute")

    detail = storage.flow_detail.find(uuid)
    assert detail.meta[META_ATTEMPT_IDS] == ["first", "again"]
