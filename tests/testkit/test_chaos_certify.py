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
from flowengine.testing.chaos import jobs as jb
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


# ---- sessions on a jobboard: conductors' claims, and where every job ended up ---------------


def posted(number: int, on_board: bool = False, owner: str | None = None,
           trashed: str | None = None, ending: str | None = "SUCCESS",
           flow_state: str | None = "SUCCESS") -> jb.JobState:
    return jb.JobState(jb.Posted(f"job-{number}", f"{PREFIX}-{number}", f"book-{number}", number),
                       on_board=on_board, owner=owner, trashed=trashed, ending=ending,
                       flow_state=flow_state)


def claimed(pid: int, claim: str, flow: str, t: float) -> dict[str, Any]:
    return {"event": "job-claimed", "pid": pid, "claim": claim, "flow": flow, "t": t}


def stepped(pid: int, claim: str, flow: str, t: float, state: str = "SUCCESS",
            atom: str = "a", ids: list[str] | None = None) -> dict[str, Any]:
    return {"event": "atom", "pid": pid, "claim": claim, "flow": flow, "t": t, "state": state,
            "atom": atom, "atom_uuid": f"{flow}-{atom}", "ids": ids or []}


def released(pid: int, claim: str, flow: str, t: float, state: str,
             error: str | None = None) -> dict[str, Any]:
    return {"event": "job-released", "pid": pid, "claim": claim, "flow": flow, "t": t,
            "state": state, "error": error}


def test_a_board_session_is_certified_with_the_recovery_of_each_conductor_fault(
        tmp_path: Path) -> None:
    uri = store(tmp_path, [(f"f{n}", states.SUCCESS, [atom("a", states.SUCCESS)])
                           for n in (1, 2, 3)])
    conductors = log(tmp_path / "conductors.jsonl", [
        claimed(100, "A", "f1", 1.0), stepped(100, "A", "f1", 2.0, "RUNNING"),
        claimed(200, "C", "f2", 3.0), stepped(200, "C", "f2", 4.0, "RUNNING", atom="b"),
        claimed(300, "D", "f3", 5.0),
        # pid 100 is killed at 10: its job is claimed again by pid 200, which moves it on.
        claimed(200, "B", "f1", 16.0), stepped(200, "B", "f1", 17.0),
        released(200, "B", "f1", 17.5, "SUCCESS"),
        # pid 200 is told to stop at 20: it ends the flow it runs itself.
        stepped(200, "C", "f2", 20.4, atom="b"), released(200, "C", "f2", 20.5, "SUCCESS"),
        # pid 300 is frozen at 30 past its claim: woken, it halts; pid 100's successor, pid
        # 400, takes the job over (its own steps under the old claim do not count).
        stepped(300, "D", "f3", 36.5), released(300, "D", "f3", 37.0, "RUNNING", "RunHalted"),
        claimed(400, "E", "f3", 37.5), stepped(400, "E", "f3", 38.0),
        released(400, "E", "f3", 38.5, "SUCCESS")])
    certificate = ct.certify(
        3, "replay", uri, PREFIX, conductors, tmp_path / "workers.jsonl",
        [applied(sc.KILL_CONDUCTOR, 10.0, 100), applied(sc.RESTART_CONDUCTOR, 20.0, 200),
         applied(sc.FREEZE_CONDUCTOR, 30.0, 300), applied(sc.KILL_CONDUCTOR, 40.0, 400)],
        jobs=[posted(1), posted(2), posted(3, ending=None)], board=("redis://board", "x"))
    assert certificate.passed, certificate.text()
    assert [(r.affected, r.seconds) for r in certificate.recoveries] == [
        (1, 7.0), (1, 0.5), (1, 8.0), (0, 0.0)]
    assert ct._statistics(certificate.conductor_recoveries) == (8.0, 7.0)
    assert certificate.jobs is not None and certificate.jobs.halted == 1
    # Its conductor killed between consuming it and recording how it ended: its flow says.
    assert certificate.jobs.unrecorded == [
        f"job {PREFIX}-3 (job-3) was consumed with its flow SUCCESS, and no conductor "
        f"recorded its ending"]
    data = certificate.to_json()
    assert data["conductor_worst_recovery"] == 8.0 and data["jobs"]["posted"] == 3
    text = certificate.text()
    assert "conductor faults: recovery worst 8.00s, median 7.00s" in text
    assert ("jobs on redis://board under x: 3 posted, ended 3 SUCCESS; left on the board 0, "
            "trashed 0, lost 0, overwritten after they ended 0") in text
    assert "CERTIFIED: every job consumed" in text


def test_jobs_left_trashed_or_lost_and_atoms_run_again_unrecorded_are_findings(
        tmp_path: Path) -> None:
    uri = store(tmp_path, [("f1", states.SUCCESS, [atom("ship", states.SUCCESS)])])
    conductors = log(tmp_path / "conductors.jsonl", [
        claimed(100, "A", "f1", 1.0),
        stepped(100, "A", "f1", 1.5, "RUNNING", atom="ship", ids=["r1"]),
        stepped(100, "A", "f1", 2.0, atom="ship", ids=["r1", "r2"]),
        released(100, "A", "f1", 2.1, "SUCCESS")])
    workers = log(tmp_path / "workers.jsonl", [
        # r2: recorded, a stale request a thawed worker started late (at-least-once);
        # r3: recorded by no engine, started after the atom was done (a conductor that had
        # lost its claim sent it): the atom ran again.
        {"event": "task-started", "pid": 7, "request_id": rid, "atom_uuid": "f1-ship",
         "flow_uuid": "f1", "task_name": "ship", "action": "execute", "attempt": 2, "t": t}
        for rid, t in (("r2", 3.0), ("r3", 4.0))])
    census = [posted(1), posted(2, on_board=True, owner="conductor-2", ending=None),
              posted(3, on_board=True, ending=None),
              posted(4, trashed="abandoned or orphaned 3 times", ending="TRASHED"),
              posted(5, ending=None, flow_state="RUNNING"), posted(6, ending="FAILED"),
              posted(7, ending="SUCCESS", flow_state="PENDING")]
    certificate = ct.certify(4, "replay", uri, PREFIX, conductors, workers, [], jobs=census,
                             board=("zookeeper://zk/flowengine", "x"))
    assert not certificate.passed
    jobs = certificate.jobs
    assert jobs is not None and not jobs.passed
    assert jobs.left == [f"job {PREFIX}-2 (job-2) still on the board, claimed by conductor-2",
                         f"job {PREFIX}-3 (job-3) still on the board, unclaimed"]
    assert jobs.trashed == [f"job {PREFIX}-4 (job-4): abandoned or orphaned 3 times"]
    assert jobs.lost == [f"job {PREFIX}-5 (job-5) is gone from the board, no conductor "
                         f"recorded its ending, and its flow is RUNNING"]
    assert jobs.ended == {"SUCCESS": 2, "TRASHED": 1, "FAILED": 1}
    # Its conductor recorded SUCCESS; a conductor that had lost the claim wrote after it.
    assert jobs.overwritten == [f"job {PREFIX}-7 (job-7) ended SUCCESS, yet its flow is "
                                f"stored PENDING: a write landed after it ended"]
    assert certificate.late == ["flow f1 atom ship: request r2 (attempt 2) started on pid 7 "
                                "1.00s after the atom was recorded done"]
    assert certificate.reran == [
        "flow f1 atom ship: request r3 (attempt 2) started on pid 7 2.00s after the atom was "
        "recorded done; no engine recorded sending it (one that could no longer record its "
        "progress sent it)"]
    assert certificate.unrecorded == 1
    text = certificate.text()
    assert "JOB LEFT: job" in text and "JOB TRASHED: job" in text and "JOB LOST: job" in text
    assert "JOB OVERWRITTEN: job" in text
    assert "RAN AGAIN: flow f1 atom ship: request r3" in text and "NOT CERTIFIED" in text
