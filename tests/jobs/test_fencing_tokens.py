"""Fencing tokens: every claim of a job gets a greater one than every earlier claim (on every
board), and a conductor frozen between its fence's check and its write cannot make that write
once a newer claim has written to the flow: the store refuses it (on every persistence backend).

``flowengine chaos --board`` found the hole these close: a conductor whose fence (judging by its
own clock) had let a write through was frozen (SIGSTOP) before the write, and made it when it
woke, after another conductor had finished the job: the job ended SUCCESS with its flow stored
PENDING.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import jobs_flows
import pytest
import store_kinds
from boards import BoardFactory
from manual_clock import ManualClock

from flowengine import states
from flowengine.conductors.backends.impl_blocking import BlockingConductor
from flowengine.jobs.posting import post_flow
from flowengine.jobs.records import fencing_token
from flowengine.persistence import backends
from flowengine.persistence import base as persistence_base


def test_a_token_grows_even_when_the_clock_goes_back() -> None:
    assert fencing_token(0, 1_700_000_000.0) == 1_700_000_000_000_000
    assert fencing_token(1_700_000_000_000_000, 1_700_000_000.0) == 1_700_000_000_000_001
    assert fencing_token(1_800_000_000_000_000, 1_700_000_000.0) == 1_800_000_000_000_001


@pytest.mark.timeout(90)
def test_every_claim_of_a_job_gets_a_greater_token(board_factory: BoardFactory) -> None:
    board, other = board_factory(claim_ttl=1.0), board_factory(claim_ttl=1.0)
    job = board.post("fenced", details={"store": {}})
    tokens = [board.claim(job, "conductor-a")]
    attempts = job.attempts
    board.abandon(job, "conductor-a", counted=False)  # a stopping conductor hands it back
    tokens.append(other.claim(job, "conductor-b"))
    # Why the attempt count cannot be the token: the uncounted abandon took its attempt back.
    assert job.attempts == attempts
    board.abandon(job, "conductor-b")
    tokens.append(board.claim(job, "conductor-a"))
    # conductor-a stops renewing (frozen, killed): the service ends its claim, and
    # conductor-b takes the job over.
    assert board.wait_until(lambda: job.state == states.UNCLAIMED, 30)
    tokens.append(other.claim(job, "conductor-b"))
    board.trash(job, "conductor-b", reason="to be posted again")
    reposted = board.repost(job.uuid)  # its attempts start again from 0; its tokens do not
    tokens.append(board.claim(reposted, "conductor-a"))
    assert all(isinstance(token, int) for token in tokens), tokens
    assert tokens == sorted(set(tokens)), f"tokens did not grow on every claim: {tokens}"


class Frozen:
    """The job of three steps two conductors run in turn: the first (its lease clock never
    moves, so its fence says it holds the claim throughout, and it never renews it) is held
    in step 2 until the second has claimed the lapsed job and started it."""

    def __init__(self, board_factory: BoardFactory, persistence: persistence_base.Backend,
                 tmp_path: Path) -> None:
        self.persistence = persistence
        self.ledger, self.gate = tmp_path / "ledger", tmp_path / "gate"
        board = board_factory(claim_ttl=2.0)
        self.job = post_flow(board, persistence, jobs_flows.steps,
                             store={"ledger": str(self.ledger), "gate": str(self.gate),
                                    "gated_step": "step-2"})
        self.frozen = BlockingConductor("frozen", board, persistence=persistence,
                                        clock=ManualClock())
        # Claims of its own long enough that a loaded machine does not end them.
        self.successor = BlockingConductor("successor", board_factory(claim_ttl=10.0),
                                           persistence=persistence)
        self.endings: list[tuple[str, str]] = []
        self.successor_running = threading.Event()
        for who in (self.frozen, self.successor):
            for event in ("job_consumed", "job_abandoned", "job_trashed"):
                who.notifier.register(event, lambda e, details, who=who: self.endings.append(
                    (who.name, e)))
        self.successor.notifier.register("running_start",
                                         lambda e, details: self.successor_running.set())

    def stored_token(self) -> int | None:
        with contextlib.closing(self.persistence.get_connection()) as conn:
            [flow_detail] = list(conn.get_logbook(self.job.book_uuid))
        return flow_detail.fencing_token


@pytest.fixture
def persistence(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[
        persistence_base.Backend]:
    backend = backends.fetch(store_kinds.store_url(request.param, request, tmp_path))
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    yield backend
    backend.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("board_backend, persistence", [
    *store_kinds.params("redis"), ("zookeeper", "memory"), ("etcd", "memory")],
    indirect=["persistence"])
def test_a_frozen_conductors_late_write_is_refused_by_the_store(
        board_factory: BoardFactory, persistence: persistence_base.Backend, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    staged = Frozen(board_factory, persistence, tmp_path)
    frozen, successor = staged.frozen, staged.successor
    caplog.set_level(logging.WARNING, logger="flowengine.conductors")
    started: list[threading.Thread] = []

    def start(conductor: BlockingConductor) -> None:
        started.append(threading.Thread(target=conductor.run, kwargs={"max_dispatches": 1}))
        started[-1].start()

    start(frozen)
    try:
        jobs_flows.wait_for_file(Path(f"{staged.gate}.waiting"))
        frozen_token = staged.stored_token()
        start(successor)
        # The frozen conductor's claim lapses on the service after 2 s; the successor claims
        # the job, records its token on the flow, loads it and starts it.
        assert staged.successor_running.wait(30), "the successor never started the job"
        assert frozen.claims_held() == {staged.job.uuid: True}  # by its own (frozen) clock
        staged.gate.touch()  # both go on from step 2: the frozen one's writes are late
        assert frozen.wait(30) and successor.wait(30)
    finally:
        for conductor in (frozen, successor):
            conductor.stop()
        for thread in started:
            thread.join(30)
    # Both ran step 2 (the frozen one was in it); its result was refused, so it halted
    # there: step 3 ran once, by the successor, and nothing was reverted.
    assert sorted(jobs_flows.ledger_lines(staged.ledger)) == [
        "step-1", "step-2", "step-2", "step-3"]
    assert staged.endings == [("successor", "job_consumed")]
    successor_token = staged.stored_token()
    assert frozen_token is not None and successor_token is not None
    assert successor_token > frozen_token
    with contextlib.closing(persistence.get_connection()) as conn:
        [flow_detail] = list(conn.get_logbook(staged.job.book_uuid))
    assert flow_detail.state == states.SUCCESS
    assert {ad.name: ad.state for ad in flow_detail if ad.name.startswith("step-")} == {
        f"step-{i}": states.SUCCESS for i in (1, 2, 3)}
    assert any("lost the claim" in r.getMessage() and "nothing reverted" in r.getMessage()
               for r in caplog.records if r.name.endswith("impl_executor")), caplog.text
