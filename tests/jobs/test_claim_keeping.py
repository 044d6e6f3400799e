"""Claim keep-alive and fencing, with an injected clock (no waiting on real time)."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jobs_flows
import pytest
from boards import BoardFactory
from manual_clock import ManualClock

from flowengine import exceptions as exc
from flowengine import states
from flowengine.conductors.backends.impl_blocking import BlockingConductor
from flowengine.conductors.backends.impl_executor import ExecutorConductor
from flowengine.conductors.backends.impl_nonblocking import NonBlockingConductor
from flowengine.conductors.claims import ClaimFence, ClaimKeeper, FencedOff
from flowengine.conductors.fencing import FencedBackend
from flowengine.jobs import base
from flowengine.jobs.posting import post_flow
from flowengine.persistence import models
from flowengine.persistence.backends import impl_memory


class FakeJob(base.Job):
    state = states.CLAIMED
    attempts = 1


class RecordingBoard:
    """Just what a keeper calls: keep_alive and register_entity."""

    def __init__(self, lost: bool = False) -> None:
        self.options = base.BoardOptions(claim_ttl=30.0)
        self.renewals: list[str] = []
        self.registrations = 0
        self.lost = lost
        self.unreachable = False

    def keep_alive(self, job: base.Job, who: str) -> None:
        if self.unreachable:
            raise exc.JobFailure("the board's server cannot be reached")
        if self.lost:
            raise base.ClaimLost(f"{who} lost {job.uuid}", job.uuid, who)
        self.renewals.append(job.uuid)

    def register_entity(self, entity: Any) -> None:
        self.registrations += 1


def _job() -> FakeJob:
    return FakeJob(None, "job")  # type: ignore[arg-type]


def _stored_book() -> tuple[impl_memory.MemoryBackend, models.LogBook]:
    """A memory backend holding a book with one flow detail, ``f`` (uuid ``fd-1``)."""
    backend = impl_memory.MemoryBackend({})
    book = models.LogBook("b")
    book.add(models.FlowDetail("f", "fd-1"))
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)
    return backend, book


def test_a_fence_holds_until_the_claim_could_have_ended() -> None:
    clock = ManualClock()
    fence = ClaimFence(_job(), ttl=30.0, clock=clock)
    fence.check("x")
    clock.advance(27.9)  # 30 s minus the 2 s margin
    assert fence.held
    clock.advance(0.2)
    assert not fence.held
    with pytest.raises(FencedOff, match="not renewed in time"):
        fence.check("atom 'a'")
    fence.renewed(sent_at=clock())
    assert fence.held
    fence.lose("taken by another conductor")
    with pytest.raises(FencedOff, match="taken by another"):
        fence.check("atom 'a'")


def test_renew_now_renews_at_once_on_the_keepers_thread() -> None:
    clock, board = ManualClock(), RecordingBoard()
    keeper = ClaimKeeper(board, "me", clock=clock, interval=3600.0)  # type: ignore[arg-type]
    renewed = threading.Event()
    board.keep_alive = lambda job, who: renewed.set()  # type: ignore[method-assign]
    keeper.hold(_job(), on_lost=lambda j: None)
    keeper.start()  # renews once as it starts, then not for an hour
    try:
        renewed.clear()
        clock.advance(5.0)
        keeper.renew_now()
        assert renewed.wait(10.0), "renew_now waited for the keeper's next round"
        assert keeper.tick() == pytest.approx(3600.0)  # the next round counts from now
    finally:
        keeper.stop()


def test_the_keeper_renews_every_third_of_the_ttl() -> None:
    clock, board = ManualClock(), RecordingBoard()
    keeper = ClaimKeeper(board, "me", entity=None, clock=clock)  # type: ignore[arg-type]
    job = _job()
    fence = keeper.hold(job, on_lost=lambda j: None)
    assert keeper.tick() == pytest.approx(10.0) and board.renewals == [job.uuid]
    clock.advance(9.9)
    assert keeper.tick() == pytest.approx(0.1) and len(board.renewals) == 1
    clock.advance(0.1)
    keeper.tick()
    assert len(board.renewals) == 2
    clock.advance(27.0)  # past the first claim's end, but renewed 10 s in
    assert fence.held
    keeper.release(job)
    clock.advance(10)
    keeper.tick()
    assert len(board.renewals) == 2


def test_a_lost_claim_closes_the_fence_and_calls_back() -> None:
    clock, board = ManualClock(), RecordingBoard(lost=True)
    keeper = ClaimKeeper(board, "me", clock=clock)  # type: ignore[arg-type]
    lost: list[str] = []
    job = _job()
    fence = keeper.hold(job, on_lost=lambda j: lost.append(j.uuid))
    keeper.tick()
    assert lost == [job.uuid] and not fence.held


def test_renewals_failing_past_the_claim_close_the_fence_and_call_back() -> None:
    # The board cannot be reached (a partition, a server down): the keeper cannot tell whether
    # the claim still stands until it could have ended, then calls back once, whatever the
    # reason the renewals failed.
    clock, board = ManualClock(), RecordingBoard()
    keeper = ClaimKeeper(board, "me", clock=clock)  # type: ignore[arg-type]
    lost: list[str] = []
    job = _job()
    fence = keeper.hold(job, on_lost=lambda j: lost.append(j.uuid))
    keeper.tick()
    board.unreachable = True
    for _ in range(2):  # 10 s and 20 s after the last renewal: the claim may still stand
        clock.advance(10.0)
        keeper.tick()
        assert lost == [] and fence.held
    clock.advance(10.0)  # 30 s: it may have ended
    keeper.tick()
    assert lost == [job.uuid] and not fence.held
    refused = fence.refusal("atom 'a'")
    assert refused is not None and "could not be renewed" in str(refused)
    clock.advance(10.0)
    board.unreachable = False
    keeper.tick()
    assert lost == [job.uuid], "called back once; the job is no longer held"


def test_claims_are_judged_on_a_clock_that_counts_host_suspension() -> None:
    import time

    from flowengine.jobs.lease_clock import lease_clock

    assert ClaimFence.__init__.__defaults__ is not None
    assert lease_clock in ClaimFence.__init__.__defaults__
    assert lease_clock in (ClaimKeeper.__init__.__defaults__ or ())
    assert lease_clock in (ExecutorConductor.__init__.__defaults__ or ())
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux: the boot-time clock, not the monotonic one
        assert abs(lease_clock() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0


def test_a_fenced_backend_refuses_writes_but_not_reads() -> None:
    clock = ManualClock()
    backend, book = _stored_book()
    fence = ClaimFence(_job(), ttl=10.0, clock=clock)
    fenced = FencedBackend(backend, fence)
    conn = fenced.get_connection()
    conn.update_flow_details(book.find("fd-1"))
    clock.advance(60)
    with pytest.raises(exc.StorageFailure, match="update flow details 'f'"):
        conn.update_flow_details(book.find("fd-1"))
    assert conn.get_logbook(book.uuid).uuid == book.uuid


class _ForeignConnection:
    """A backend's connection with a write method no flowengine backend has."""

    description = "a foreign store"

    def __init__(self) -> None:
        self.purged = 0

    def purge_flow(self, fd_uuid: str) -> None:
        self.purged += 1

    def get_flow_details(self, fd_uuid: str) -> str:
        return fd_uuid

    def fenced(self, flow_uuid: str, token: int) -> None:
        return None  # takes no token: fenced by the clock alone

    def close(self) -> None:
        pass


def test_a_fenced_backend_fences_every_method_but_the_reads_it_knows() -> None:
    # What counts as a write is not listed: anything a connection offers beyond its reads is
    # fenced, so a write method added to a backend cannot slip past a lapsed claim.
    clock = ManualClock()
    foreign = _ForeignConnection()

    class Foreign:
        def get_connection(self) -> _ForeignConnection:
            return foreign

    fence = ClaimFence(_job(), ttl=10.0, clock=clock, token=7)
    conn = FencedBackend(Foreign(), fence, "fd-1").get_connection()  # type: ignore[arg-type]
    conn.purge_flow("fd-1")
    clock.advance(60)
    with pytest.raises(FencedOff, match="purge flow"):
        conn.purge_flow("fd-1")
    assert foreign.purged == 1
    assert conn.get_flow_details("fd-1") == "fd-1"
    assert conn.description == "a foreign store"


class FreezingBackend:
    """A backend whose flow writes take ``freeze`` seconds of ``clock``: a conductor frozen
    after its fence check, before its write reached the store."""

    def __init__(self, backend: impl_memory.MemoryBackend, clock: ManualClock,
                 freeze: float) -> None:
        self._backend, self._clock, self._freeze = backend, clock, freeze

    def get_connection(self) -> Any:
        connection = self._backend.get_connection()
        clock, freeze = self._clock, self._freeze

        class Freezing:
            def __getattr__(self, name: str) -> Any:
                return getattr(connection, name)

            def update_flow_details(self, flow_detail: Any) -> Any:
                clock.advance(freeze)
                return connection.update_flow_details(flow_detail)

        return Freezing()


def test_a_write_the_claim_lapsed_during_is_refused_once_it_lands() -> None:
    # The write itself cannot be taken back (a fencing token checked by the store would be
    # needed), but its caller must hear the claim is gone: the engine writes an atom's
    # RUNNING state and then sends its request, which must not go out.
    clock = ManualClock()
    backend, book = _stored_book()
    fence = ClaimFence(_job(), ttl=10.0, clock=clock)
    conn = FencedBackend(FreezingBackend(backend, clock, freeze=60.0), fence).get_connection()
    flow_detail = book.find("fd-1")
    flow_detail.state = states.RUNNING
    with pytest.raises(FencedOff, match="update flow details 'f'.*not renewed in time"):
        conn.update_flow_details(flow_detail)
    with contextlib.closing(backend.get_connection()) as plain:
        assert plain.get_logbook(book.uuid).find("fd-1").state == states.RUNNING  # it landed


class GatedJob:
    """A job of three steps on a board with 2 s claims, its step 2 waiting for ``gate``."""

    def __init__(self, board_factory: BoardFactory, tmp_path: Path) -> None:
        self.board = board_factory(claim_ttl=2.0)
        self.persistence = impl_memory.MemoryBackend({})
        self.ledger, self.gate = tmp_path / "ledger", tmp_path / "gate"
        self.job = post_flow(self.board, self.persistence, jobs_flows.steps,
                             store={"ledger": str(self.ledger), "gate": str(self.gate),
                                    "gated_step": "step-2"})
        self.endings: list[str] = []

    def watch(self, conductor: ExecutorConductor) -> None:
        """Keep how the conductor ends jobs in :attr:`endings`."""
        for event in ("job_consumed", "job_abandoned", "job_trashed"):
            conductor.notifier.register(event, lambda e, details: self.endings.append(e))


def test_a_conductor_past_its_claim_starts_no_further_atom(board_factory: BoardFactory,
                                                           tmp_path: Path) -> None:
    staged = GatedJob(board_factory, tmp_path)
    board, persistence, job = staged.board, staged.persistence, staged.job
    ledger, gate, endings = staged.ledger, staged.gate, staged.endings
    clock = ManualClock()
    conductor = BlockingConductor("frozen", board, persistence=persistence, clock=clock)
    staged.watch(conductor)
    thread = threading.Thread(target=conductor.run, kwargs={"max_dispatches": 1})
    thread.start()
    jobs_flows.wait_for_file(Path(f"{gate}.waiting"))
    clock.advance(2.0)  # as if frozen past its claim: no renewal happened meanwhile
    gate.touch()
    assert conductor.wait(20)
    thread.join()
    assert jobs_flows.ledger_lines(ledger) == ["step-1", "step-2"]  # step-3 never ran
    assert endings == []  # the job is left to whoever claims it next
    with contextlib.closing(persistence.get_connection()) as conn:
        [flow_detail] = list(conn.get_logbook(job.book_uuid))
        step2 = next(ad for ad in flow_detail if ad.name == "step-2")
        assert step2.state == states.RUNNING  # its result was refused, so it will run again


def test_a_conductor_that_stopped_trusting_a_claim_the_board_still_holds_hands_it_back(
        board_factory: BoardFactory, tmp_path: Path) -> None:
    # Its fence lapsed by its own clock (a frozen or starved conductor) while the board still
    # has its claim: the run halts, and the claim must not outlive it with nobody running
    # the job (on ZooKeeper it would last as long as the conductor's session).
    staged = GatedJob(board_factory, tmp_path)
    board, persistence, job = staged.board, staged.persistence, staged.job
    clock = ManualClock()
    conductor = BlockingConductor("starved", board, persistence=persistence, clock=clock)
    thread = threading.Thread(target=conductor.run, kwargs={"max_dispatches": 1})
    thread.start()
    jobs_flows.wait_for_file(Path(f"{staged.gate}.waiting"))
    assert board.find_owner(job) == "starved"
    clock.advance(2.0)  # its fence lapses; no renewal happened by its clock
    staged.gate.touch()
    assert conductor.wait(20)
    thread.join()
    assert staged.endings == []
    assert board.find_owner(job) is None  # handed back, not left to lapse (or never to)


def test_a_conductor_does_not_claim_again_a_job_it_still_runs(board_factory: BoardFactory,
                                                               tmp_path: Path) -> None:
    """Its claim lapsed while its engine still ran the job (frozen, then woken): the job is
    the next conductor's, and not this one's again until that run has ended. Claimed again
    meanwhile, both runs were the same job to it: the first one's end took the second one's
    record with it, and the second was trashed ('dispatching it failed') with its flow left
    RUNNING (``flowengine chaos --board`` found it)."""
    staged = GatedJob(board_factory, tmp_path)
    board, persistence, job = staged.board, staged.persistence, staged.job
    ledger, gate, endings = staged.ledger, staged.gate, staged.endings
    clock = ManualClock()
    # Room for two jobs, one thread to run them: a second run of the job waits for the first.
    conductor = NonBlockingConductor("woken", board, persistence=persistence, clock=clock,
                                     max_simultaneous_jobs=2,
                                     executor_factory=lambda: ThreadPoolExecutor(max_workers=1))
    staged.watch(conductor)
    thread = threading.Thread(target=conductor.run, kwargs={"max_dispatches": 2})
    thread.start()
    try:
        jobs_flows.wait_for_file(Path(f"{gate}.waiting"))
        # The manual clock stands still, so no renewal is sent: the service ends the claim
        # after 2 s of real time (the freeze), and the conductor's waiting is pushed that news.
        threading.Event().wait(2.0 + 1.0)
        clock.advance(2.0)  # woken: its own clock says the claim may have lapsed
        gate.touch()
        assert conductor.wait(30), "the conductor did not finish its two dispatches"
    finally:
        conductor.stop()
        thread.join(30)
    assert endings == ["job_consumed"], endings
    assert list(board.iter_trash()) == []
    with contextlib.closing(persistence.get_connection()) as conn:
        [flow_detail] = list(conn.get_logbook(job.book_uuid))
        assert flow_detail.state == states.SUCCESS
    # The first run's step 2 ran to its end (its outcome refused); the second ran it again.
    assert jobs_flows.ledger_lines(ledger) == ["step-1", "step-2", "step-2", "step-3"]
