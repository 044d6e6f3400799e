"""The jobboard contract, run against every backend (see ``conftest.board_factory``).

Boards made by one test share a namespace, so a second board plays another conductor's part.
Claims in these tests last 1-2 s; nothing sleeps to synchronise: expiry and notifications are
awaited through the board's own pushed ``wait``.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from boards import BoardFactory

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import base
from flowengine.jobs.base import JobBoard, JobPriority
from flowengine.persistence import models
from flowengine.persistence.backends import impl_memory
from flowengine.types.entity import Entity

#: Seconds a board's own announcements may take to arrive (its follower thread may lag).
_ANNOUNCED = 30.0


def _uuids(jobs: object) -> list[str]:
    return [job.uuid for job in jobs]  # type: ignore[attr-defined]


def test_post_is_listed_unclaimed_with_its_details(board: JobBoard,
                                                   board_factory: BoardFactory) -> None:
    job = board.post("resize", details={"store": {"size": 3}}, priority="high")
    other = board_factory()
    [seen] = list(other.iterjobs(ensure_fresh=True))
    assert (seen.uuid, seen.name, seen.details, seen.priority) == (
        job.uuid, "resize", {"store": {"size": 3}}, JobPriority.HIGH)
    assert seen.state == states.UNCLAIMED and seen.attempts == 0
    assert seen.created_on is not None and other.job_count == 1


def test_the_posting_board_lists_its_job_at_once(board: JobBoard) -> None:
    # Read from the board's cache (no ensure_fresh), which its own post must already hold,
    # not only once the service announced it back.
    for number in range(30):
        job = board.post(f"j{number}")
        assert job.uuid in _uuids(board.iterjobs(only_unclaimed=True))
        assert board.job_count == number + 1


def test_fresh_listings_racing_the_boards_own_writes_never_undo_them(board: JobBoard) -> None:
    # A listing read just before a post (a consume) and applied just after it must not take
    # the posted job out of the cache (bring the consumed one back), nor announce it: another
    # thread lists all along.
    seen: dict[str, list[str]] = {base.POSTED: [], base.REMOVAL: []}
    # Announcements come from the board's own follower (Redis: its pub/sub thread), after the
    # write that caused them returned: the last ones are awaited, not assumed.
    heard = threading.Condition()

    def hear(uuids: list[str], details: dict[str, object]) -> None:
        with heard:
            uuids.append(details["job"].uuid)  # type: ignore[attr-defined]
            heard.notify_all()

    for kind, uuids in seen.items():
        board.notifier.register(kind, lambda _event, details, uuids=uuids: hear(uuids, details))
    stop, failures = threading.Event(), []

    def list_all_along() -> None:
        try:
            while not stop.is_set():
                list(board.iterjobs(ensure_fresh=True))
        except Exception as err:  # reported by the test, not lost in the thread
            failures.append(err)

    lister = threading.Thread(target=list_all_along, daemon=True)
    lister.start()
    try:
        jobs = []
        for number in range(30):
            jobs.append(board.post(f"j{number}"))
            assert jobs[-1].uuid in _uuids(board.iterjobs()), f"post {number} dropped"
        assert not seen[base.REMOVAL] and board.job_count == 30
        for number, job in enumerate(jobs):
            board.claim(job, "me")
            board.consume(job, "me")
            assert job.uuid not in _uuids(board.iterjobs()), f"consumed job {number} is back"
    finally:
        stop.set()
        lister.join(10)
    assert not failures
    with heard:
        heard.wait_for(lambda: len(seen[base.REMOVAL]) >= len(jobs), timeout=_ANNOUNCED)
    assert sorted(seen[base.POSTED]) == sorted(seen[base.REMOVAL]) == sorted(_uuids(jobs))
    assert board.job_count == 0


def test_details_that_are_not_json_are_refused_naming_the_job(board: JobBoard) -> None:
    with pytest.raises(ValueError, match="'bad'"):
        board.post("bad", details={"when": object()})
    assert board.job_count == 0


def test_claim_is_exclusive_even_for_the_same_owner(board: JobBoard,
                                                    board_factory: BoardFactory) -> None:
    job = board.post("j")
    board.claim(job, "alice")
    assert job.state == states.CLAIMED and board.find_owner(job) == "alice"
    assert job.attempts == 1
    other = board_factory()
    [seen] = list(other.iterjobs(ensure_fresh=True))
    with pytest.raises(exc.UnclaimableJob, match="alice"):
        other.claim(seen, "bob")
    with pytest.raises(exc.UnclaimableJob, match="alice"):
        board.claim(job, "alice")
    assert list(other.iterjobs(only_unclaimed=True, ensure_fresh=True)) == []


def test_consume_removes_the_job_for_its_owner_only(board: JobBoard) -> None:
    job = board.post("j")
    with pytest.raises(exc.NotFound, match="not claimed"):  # TaskFlow's: no owner to find
        board.consume(job, "alice")
    board.claim(job, "alice")
    with pytest.raises(exc.JobFailure, match="alice"):
        board.consume(job, "bob")
    board.consume(job, "alice")
    assert job.state == states.COMPLETE and board.job_count == 0
    with pytest.raises(exc.NotFound):
        board.consume(job, "alice")
    with pytest.raises(exc.NotFound):
        board.find_owner(job)


def test_abandon_frees_the_job_and_keeps_its_attempt(board: JobBoard) -> None:
    job = board.post("j")
    board.claim(job, "alice")
    with pytest.raises(exc.JobFailure):
        board.abandon(job, "bob")
    board.abandon(job, "alice")
    assert job.state == states.UNCLAIMED and board.find_owner(job) is None
    assert job.attempts == 1
    board.claim(job, "bob")
    assert board.find_owner(job) == "bob" and job.attempts == 2


def test_an_uncounted_abandon_gives_the_attempt_back(board: JobBoard) -> None:
    job = board.post("j")
    board.claim(job, "alice")
    board.abandon(job, "alice", counted=False)
    assert job.attempts == 0 and job.state == states.UNCLAIMED


def test_trash_keeps_the_reason_and_repost_restores_the_job(board: JobBoard) -> None:
    job = board.post("j", details={"k": 1})
    board.claim(job, "alice")
    with pytest.raises(exc.JobFailure):
        board.trash(job, "bob")
    board.trash(job, "alice", reason="bad input")
    assert job.state == states.COMPLETE and board.job_count == 0
    [trashed] = board.iter_trash()
    assert (trashed.uuid, trashed.name, trashed.reason, trashed.attempts) == (
        job.uuid, "j", "bad input", 1)
    back = board.repost(job.uuid)
    assert back.uuid == job.uuid and back.details == {"k": 1}
    assert back.state == states.UNCLAIMED and back.attempts == 0 and board.iter_trash() == []
    with pytest.raises(exc.NotFound):
        board.repost(job.uuid)


def test_a_claim_taken_only_to_trash_is_not_an_attempt(board: JobBoard) -> None:
    # What `flowengine jobs trash` does with a job nobody ran: claim it, trash it uncounted.
    job = board.post("never-ran")
    board.claim(job, "operator")
    board.trash(job, "operator", reason="not today", counted=False)
    ran = board.post("ran-once")
    board.claim(ran, "conductor")
    board.abandon(ran, "conductor")
    board.claim(ran, "operator")
    board.trash(ran, "operator", counted=False)
    assert {t.name: t.attempts for t in board.iter_trash()} == {"never-ran": 0, "ran-once": 1}


def test_discard_deletes_a_trashed_job(board: JobBoard) -> None:
    job = board.post("j")
    board.claim(job, "alice")
    board.trash(job, "alice")
    board.discard(job.uuid)
    assert board.iter_trash() == []
    with pytest.raises(exc.NotFound):
        board.discard(job.uuid)


def test_attempts_past_the_limit_send_the_job_to_the_trash(board_factory: BoardFactory) -> None:
    board = board_factory(max_attempts=2)
    job = board.post("poison")
    board.claim(job, "a")
    board.abandon(job, "a")
    board.claim(job, "b")
    board.abandon(job, "b")
    assert job.state == states.COMPLETE
    [trashed] = board.iter_trash()
    assert trashed.uuid == job.uuid and trashed.attempts == 2
    assert "abandoned or orphaned 2 times" in trashed.reason


def test_an_expired_claim_frees_the_job_for_another_owner(board_factory: BoardFactory) -> None:
    holder = board_factory(claim_ttl=1.0)
    other = board_factory(claim_ttl=1.0)
    job = holder.post("j")
    holder.claim(job, "frozen")
    claimed_at = time.monotonic()
    assert list(other.iterjobs(only_unclaimed=True, ensure_fresh=True)) == []
    # Nobody renews: the service ends the claim itself, and the waiter is woken for it.
    [freed] = list(other.wait(timeout=10))
    assert time.monotonic() - claimed_at >= 0.9
    assert freed.uuid == job.uuid and other.find_owner(freed) is None
    with pytest.raises(base.ClaimLost):
        holder.keep_alive(job, "frozen")
    other.claim(freed, "rescuer")
    assert freed.attempts == 2


@pytest.mark.parametrize("action", ["consume", "abandon", "trash"])
def test_finishing_a_job_nobody_claimed_is_not_found(board: JobBoard, action: str) -> None:
    # TaskFlow's answer on every backend: NotFound when the job has no owner, JobFailure when
    # another owner holds it (the conductor handles both the same way).
    job = board.post("j")
    with pytest.raises(exc.NotFound, match="not claimed"):
        getattr(board, action)(job, "alice")
    board.claim(job, "bob")
    with pytest.raises(exc.JobFailure, match="bob") as refused:
        getattr(board, action)(job, "alice")
    assert not isinstance(refused.value, exc.NotFound)
    assert job.state == states.CLAIMED


def test_a_claim_given_an_expiry_lasts_that_long(board_factory: BoardFactory) -> None:
    # TaskFlow's claim(job, who, expiry=seconds): this claim's lease, not the board's claim_ttl.
    holder = board_factory(claim_ttl=30.0)
    other = board_factory(claim_ttl=30.0)
    job = holder.post("j")
    holder.claim(job, "brief", expiry=0.5)  # etcd rounds leases up to whole seconds
    claimed_at = time.monotonic()
    assert job.state == states.CLAIMED
    [freed] = list(other.wait(timeout=10))
    assert 0.4 <= time.monotonic() - claimed_at < 10
    assert freed.uuid == job.uuid and other.find_owner(freed) is None
    for bad in (0, -1.0, "soon", True):
        with pytest.raises(ValueError, match="expiry"):
            holder.claim(freed, "again", expiry=bad)


def test_keep_alive_renews_only_the_holders_claim(board_factory: BoardFactory) -> None:
    board = board_factory(claim_ttl=1.0)
    job = board.post("j")
    board.claim(job, "alice")
    with pytest.raises(base.ClaimLost, match="bob"):
        board.keep_alive(job, "bob")
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # renewing for 2.5 claim lengths keeps it claimed
        board.keep_alive(job, "alice")
        with contextlib.suppress(exc.NotFound):
            list(board.wait(timeout=0.3))
        assert board.find_owner(job) == "alice"


def test_an_orphaned_job_past_its_attempts_is_trashed_on_the_next_claim(
        board_factory: BoardFactory) -> None:
    board = board_factory(claim_ttl=1.0, max_attempts=1)
    job = board.post("j")
    board.claim(job, "dies")
    list(board.wait(timeout=10))  # the claim expired
    with pytest.raises(exc.UnclaimableJob, match="trash"):
        board.claim(job, "next")
    [trashed] = board.iter_trash()
    assert "orphaned 1 times" in trashed.reason


def test_wait_is_woken_by_a_post(board: JobBoard, board_factory: BoardFactory) -> None:
    waiter = board_factory()
    got: list[list[str]] = []
    started = threading.Event()

    def wait() -> None:
        started.set()
        got.append(_uuids(waiter.wait(timeout=10)))

    thread = threading.Thread(target=wait)
    thread.start()
    started.wait()
    job = board.post("j")
    thread.join(10)
    assert got == [[job.uuid]]


def test_wait_times_out_with_not_found(board: JobBoard) -> None:
    with pytest.raises(exc.NotFound, match="No unclaimed job"):
        board.wait(timeout=0.2)


def test_wait_is_woken_by_an_abandon(board: JobBoard, board_factory: BoardFactory) -> None:
    job = board.post("j")
    board.claim(job, "alice")
    waiter = board_factory()
    got: list[list[str]] = []
    thread = threading.Thread(target=lambda: got.append(_uuids(waiter.wait(timeout=10))))
    thread.start()
    board.abandon(job, "alice")
    thread.join(10)
    assert got == [[job.uuid]]


def test_job_wait_returns_when_another_board_consumes_it(board: JobBoard,
                                                         board_factory: BoardFactory) -> None:
    job = board.post("j")
    assert job.wait(timeout=0.1) is False
    other = board_factory()
    [seen] = list(other.iterjobs(ensure_fresh=True))
    other.claim(seen, "worker")
    thread = threading.Thread(target=lambda: other.consume(seen, "worker"))
    thread.start()
    assert job.wait(timeout=10) is True
    thread.join()


def test_iterjobs_cached_follows_changes_and_fresh_reads_now(board: JobBoard,
                                                             board_factory: BoardFactory) -> None:
    follower = board_factory()
    job = board.post("j")
    assert _uuids(follower.iterjobs(ensure_fresh=True)) == [job.uuid]
    list(follower.wait(timeout=10))
    deadline = time.monotonic() + 5  # the cache catches up with the notification
    while _uuids(follower.iterjobs()) != [job.uuid] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _uuids(follower.iterjobs()) == [job.uuid]
    board.claim(job, "alice")
    assert list(follower.iterjobs(only_unclaimed=True)) == []
    board.consume(job, "alice")
    assert job.wait(timeout=10)
    assert _uuids(follower.iterjobs(ensure_fresh=True)) == []


def test_jobs_come_most_urgent_first_then_oldest(board: JobBoard) -> None:
    low = board.post("low", priority=JobPriority.LOW)
    first = board.post("first")
    second = board.post("second")
    urgent = board.post("urgent", priority="very_high")
    assert _uuids(board.iterjobs(ensure_fresh=True)) == [urgent.uuid, first.uuid, second.uuid,
                                                         low.uuid]


def test_board_notifier_announces_posts_and_removals(board: JobBoard,
                                                     board_factory: BoardFactory) -> None:
    follower = board_factory()
    assert isinstance(follower, base.NotifyingJobBoard)
    seen: list[tuple[str, str]] = []
    removed = threading.Event()

    def on_event(event: str, details: dict[str, object]) -> None:
        seen.append((event, details["job"].uuid))  # type: ignore[attr-defined]
        if event == base.REMOVAL:
            removed.set()

    follower.notifier.register(base.POSTED, on_event)
    follower.notifier.register(base.REMOVAL, on_event)
    job = board.post("j")
    board.claim(job, "a")
    board.consume(job, "a")
    assert removed.wait(10)
    assert seen == [(base.POSTED, job.uuid), (base.REMOVAL, job.uuid)]


def test_entities_are_listed_while_registered(board_factory: BoardFactory) -> None:
    board = board_factory(claim_ttl=1.0)
    other = board_factory()
    one = Entity("conductor", "c-1", {"host": "h", "pid": 1})
    board.register_entity(one)
    board.register_entity(Entity("conductor", "c-2"))
    assert [e.name for e in other.iter_entities("conductor")] == ["c-1", "c-2"]
    assert other.iter_entities("conductor")[0] == one
    board.unregister_entity(one)
    assert [e.name for e in other.iter_entities()] == ["c-2"]
    deadline = time.monotonic() + 5  # not refreshed: gone after its 1 s lease
    while other.iter_entities() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert other.iter_entities() == []


def test_a_jobs_book_is_loaded_from_persistence(board_factory: BoardFactory) -> None:
    backend = impl_memory.MemoryBackend({})
    book = models.LogBook("book-1")
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)
    poster = board_factory(persistence=backend)
    job = poster.post("j", book=book)
    reader = board_factory(persistence=backend)
    [seen] = list(reader.iterjobs(ensure_fresh=True))
    assert (seen.book_uuid, seen.book_name) == (book.uuid, "book-1")
    assert seen.book is not None and seen.book.uuid == book.uuid == job.book_uuid


def test_str_of_a_job_masks_secrets(board: JobBoard) -> None:
    job = board.post("j", details={"store": {"password": "hunter2", "url": "redis://u:pw@h/0"}})
    shown = str(job)
    assert "hunter2" not in shown and ":pw@" not in shown and "***" in shown
