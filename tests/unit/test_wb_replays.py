"""Signatures of the signed requests a worker ran: claimed once, shared, then forgotten."""

from __future__ import annotations

from pathlib import Path

import pytest
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine.worker_based import signing as sg
from flowengine.worker_based.worker_side import replays as rp

WINDOW = 900.0
START = 1_800_000_000.0


def _signed(signature: str, signed_at: float = START) -> dict[str, object]:
    return {sg.HEADER_SIGNATURE: signature, sg.HEADER_SIGNED_AT: signed_at}


def test_a_signature_is_claimed_once_by_every_worker_sharing_the_folder(tmp_path: Path) -> None:
    clock = ManualClock(START)
    one = rp.RunRequests(str(tmp_path), WINDOW, clock)
    assert one.claim(_signed("v1:aa"))
    assert not one.claim(_signed("v1:aa"))
    # A sibling process, or this worker after a restart: the same folder.
    assert not rp.RunRequests(str(tmp_path), WINDOW, clock).claim(_signed("v1:aa"))
    assert one.claim(_signed("v1:bb"))  # another request (or this one, signed afresh)


def test_claims_are_forgotten_once_a_copy_would_be_refused_as_stale(tmp_path: Path) -> None:
    clock = ManualClock(START)
    runs = rp.RunRequests(str(tmp_path), WINDOW, clock)
    assert runs.claim(_signed("v1:aa"))
    clock.advance(WINDOW)  # still within reach of a copy: kept
    assert not runs.claim(_signed("v1:aa"))
    clock.advance(rp.BUCKET_SECONDS + rp.PURGE_PERIOD)
    runs.claim(_signed("v1:cc", clock.now))  # purges on the way
    assert [p.name for p in tmp_path.iterdir()] == [str(int(clock.now // rp.BUCKET_SECONDS))]


def test_unsigned_headers_are_never_claimed(tmp_path: Path) -> None:
    runs = rp.RunRequests(str(tmp_path), WINDOW)
    assert runs.claim({})
    assert runs.claim({})
    assert runs.claim(_signed("v1:aa", True))  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_an_unusable_folder_falls_back_to_memory(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"  # where the folder should be (even root cannot write there)
    blocker.write_text("")
    runs = rp.RunRequests(str(blocker / "claims"), WINDOW)
    assert runs.claim(_signed("v1:aa"))
    assert not runs.claim(_signed("v1:aa"))
    assert "kept in memory" in caplog.text


def test_the_default_folder_is_per_broker_exchange_and_topic() -> None:
    folders = {rp.default_folder("redis://h:6379/0", "x", "t"),
               rp.default_folder("redis://h:6379/1", "x", "t"),
               rp.default_folder("redis://h:6379/0", "y", "t"),
               rp.default_folder("redis://h:6379/0", "x", "u")}
    assert len(folders) == 4
