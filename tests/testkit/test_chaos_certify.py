"""The chaos certificate, judged over a store and logs written by hand."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import backends, models
from flowengine.testing.chaos import certify as ct
from flowengine.testing.chaos import schedule as sc
from flowengine.types.failure import Failure

PREFIX = "chaos-1"


def store(tmp_path: Path, flows: list[tuple[str, str, list[models.TaskDetail]]]) -> str:
    uri = f"sqlite:///{tmp_path / 'chaos.db'}"
    backend = backends.fetch(uri)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
        for number, (uuid, state, atoms) in enumerate(flows, 1):
            detail = models.FlowDetail("order", uuid)
            detail.state = state
            for atom in atoms:
                detail.add(atom)
            book = models.LogBook(f"{PREFIX}-{number}")
            book.add(detail)
            conn.save_logbook(book)
    backend.close()
    return uri


def atom(name: str, state: str, failure: BaseException | None = None,
         attempts: list[dict[str, Any]] | None = None) -> models.TaskDetail:
    detail = models.TaskDetail(name, f"{name}-uuid-{id(object())}")
    detail.state = state
    if failure is not None:
        detail.failure = Failure.from_exception(failure)
    if attempts is not None:
        detail.meta = {"attempt_log": attempts}
    return detail


def log(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def applied(kind: str, t: float, pid: int) -> ct.Applied:
    return ct.Applied(sc.Fault(t, kind, 0, 1.0), t, pid, "process")


def test_a_clean_run_is_certified_with_its_recovery_times(tmp_path: Path) -> None:
    uri = store(tmp_path, [("f1", states.SUCCESS, [atom("reserve", states.SUCCESS)]),
                           ("f2", states.REVERTED, [atom("ship", states.REVERTED,
                                                         RuntimeError("declined"))])])
    engine = log(tmp_path / "engine.jsonl", [
        {"event": "flow-start", "flow": "f1", "t": 1.0},
        {"event": "atom", "flow": "f1", "atom_uuid": "a1", "state": "RUNNING", "t": 1.1},
        {"event": "atom", "flow": "f1", "atom_uuid": "a1", "state": "SUCCESS", "t": 12.5},
        {"event": "flow-start", "flow": "f2", "t": 15.0},
        {"event": "flow-resume", "flow": "f2", "t": 21.0},
        {"event": "atom", "flow": "f2", "atom_uuid": "a2", "state": "FAILURE", "t": 23.0},
        {"event": "flow-end", "flow": "f2", "state": "REVERTED", "t": 24.0},
        {"event": "flow-end", "flow": "f1", "state": "SUCCESS", "t": 25.0}])
    workers = log(tmp_path / "workers.jsonl", [
        {"event": "task-started", "pid": 100, "request_id": "r1", "atom_uuid": "a1",
         "action": "execute", "t": 9.0},
        {"event": "task-started", "pid": 200, "request_id": "r2", "atom_uuid": "a1",
         "action": "execute", "t": 11.0},
        {"event": "task-succeeded", "pid": 200, "request_id": "r2", "atom_uuid": "a1",
         "action": "execute", "t": 12.0},
        {"event": "task-succeeded", "pid": 100, "request_id": "r1", "atom_uuid": "a1",
         "action": "execute", "t": 14.0}])
    certificate = ct.certify(
        1, "replay", uri, PREFIX, engine, workers,
        [applied(sc.KILL_WORKER, 10.0, 100), applied(sc.FREEZE_WORKER, 13.0, 300),
         applied(sc.RESTART_ENGINE, 20.0, 400)])
    assert certificate.passed, certificate.text()
    assert certificate.flows == 2 and certificate.ended == {"SUCCESS": 1, "REVERTED": 1}
    assert [(r.affected, r.seconds) for r in certificate.recoveries] == [
        (1, 2.5), (0, 0.0), (2, 5.0)]  # f2 moved on at 23, f1 (the slowest) at 25
    assert (certificate.worst, certificate.median) == (5.0, 3.75)  # of the two that hit work
    assert certificate.duplicates == 1  # r1 finished too, after r2
    assert "CERTIFIED" in certificate.text() and "seed: 1 (replay: replay)" in certificate.text()


def test_hung_failed_lost_and_rerun_work_is_reported(tmp_path: Path) -> None:
    twice = [{"attempt": 1, "action": "execute", "outcome": "SUCCESS"},
             {"attempt": 2, "action": "execute", "outcome": "SUCCESS"}]
    uri = store(tmp_path, [
        ("hung", states.RUNNING, [atom("charge", states.RUNNING)]),
        ("failed", states.FAILURE, [atom("ship", states.REVERT_FAILURE, RuntimeError("x"))]),
        ("lost", states.REVERTED, [atom("ship", states.REVERTED,
                                        exc.WorkerLost("ship", 3, ["w1", "w2", "w3"]))]),
        ("rerun", states.SUCCESS, [atom("charge", states.SUCCESS, attempts=twice)])])
    engine = log(tmp_path / "engine.jsonl", [
        {"event": "atom", "flow": "rerun", "atom": "charge", "atom_uuid": "a9",
         "state": "SUCCESS", "t": 5.0, "pid": 1},
        {"event": "atom", "flow": "hung", "atom_uuid": "a7", "state": "RUNNING", "t": 6.0},
        {"event": "atom", "flow": "rerun", "atom": "charge", "atom_uuid": "a9",
         "state": "RUNNING", "t": 9.0, "pid": 2}])  # a resumed engine runs it again
    workers = log(tmp_path / "workers.jsonl", [
        {"event": "task-started", "pid": 100, "request_id": "r9", "atom_uuid": "a9",
         "flow_uuid": "rerun", "task_name": "charge", "action": "execute", "attempt": 1,
         "t": 8.0}])
    certificate = ct.certify(2, "replay", uri, PREFIX, engine, tmp_path / "none.jsonl",
                             [applied(sc.KILL_WORKER, 7.0, 100)])
    assert not certificate.passed
    assert certificate.hung == ["flow hung still RUNNING: charge=RUNNING"]
    assert certificate.failed == ["flow failed ended FAILURE (RuntimeError)"]
    assert certificate.lost_work == ["flow lost reverted after losing its work (WorkerLost)"]
    assert certificate.reran == [
        "flow rerun atom charge: two completed executes stored without a revert between them",
        "flow rerun atom charge: started again by engine pid 2 4.00s after it was recorded "
        "done"]
    # Without workers' log (TaskFlow's workers): every atom then in flight was hit.
    [recovery] = certificate.recoveries
    assert (recovery.affected, recovery.seconds) == (1, None)
    # A request the worker started only after the atom was done: at-least-once, information.
    logged = ct.certify(2, "replay", uri, PREFIX, engine, workers, [])
    assert logged.late == ["flow rerun atom charge: request r9 (attempt 1) started on pid 100 "
                           "3.00s after the atom was recorded done"]
    text = certificate.text()
    assert "HUNG: flow hung" in text and "NOT RECOVERED" in text and "NOT CERTIFIED" in text
