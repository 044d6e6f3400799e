"""The chaos schedule: one seed, one schedule; every kind of fault early; freezes past the lease."""

from __future__ import annotations

import pytest

from flowengine.testing.chaos import schedule as sc


def test_the_same_seed_gives_the_same_schedule() -> None:
    assert sc.schedule(7, 120, 3, 5.0) == sc.schedule(7, 120, 3, 5.0)
    assert sc.schedule(7, 120, 3, 5.0) != sc.schedule(8, 120, 3, 5.0)


@pytest.mark.parametrize("seed", range(20))
def test_a_short_run_meets_every_kind_and_freezes_outlast_the_lease(seed: int) -> None:
    faults = sc.schedule(seed, 20, 3, 5.0)
    assert {f.kind for f in faults[:4]} == set(sc.KINDS)
    assert all(0 < f.at < 20 for f in faults)
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    assert all(f.hold > 5.0 for f in faults if f.kind == sc.FREEZE_WORKER)
    assert all(0 <= f.slot < 3 for f in faults)
    assert all(f.slot == 0 for f in faults if f.kind == sc.RESTART_ENGINE)


@pytest.mark.parametrize("seed", range(20))
def test_a_session_ends_with_a_worker_killed(seed: int) -> None:
    # What the engine recovers on its own, not by being restarted, is what a session ends on.
    assert sc.schedule(seed, 25, 3, 5.0)[-1].kind == sc.KILL_WORKER


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        sc.schedule(1, 20, 0, 5.0)
    with pytest.raises(ValueError, match="too short for any fault"):
        sc.schedule(1, 1, 3, 5.0)


@pytest.mark.parametrize("seed", range(20))
def test_with_conductors_they_are_killed_frozen_past_the_claim_and_restarted(seed: int) -> None:
    faults = sc.schedule(seed, 40, 3, 5.0, conductors=2, claim_ttl=4.0)
    assert {f.kind for f in faults[:6]} == set(sc.BOARD_KINDS)
    assert sc.RESTART_ENGINE not in {f.kind for f in faults}  # the conductors are the engines
    assert all(0 <= f.slot < 2 for f in faults if f.on_conductor)
    assert all(f.hold > 4.0 for f in faults if f.kind == sc.FREEZE_CONDUCTOR)
    assert all(f.hold > 5.0 for f in faults if f.kind == sc.FREEZE_WORKER)
    assert faults[-1].kind == sc.KILL_WORKER


def test_conductors_leave_a_schedule_without_them_as_it_was() -> None:
    # The figures doc/proving.rst gives for sessions without a board replay with their seeds.
    assert sc.schedule(2029, 120, 3, 5.0, conductors=0, claim_ttl=9.0) == \
        sc.schedule(2029, 120, 3, 5.0)
    assert sc.schedule(7, 40, 3, 5.0, conductors=3, claim_ttl=5.0) == \
        sc.schedule(7, 40, 3, 5.0, conductors=3, claim_ttl=5.0)
    assert str(sc.Fault(1.0, sc.FREEZE_CONDUCTOR, 1, 6.5)) == \
        "   1.0s  freeze-conductor (conductor slot 1) for 6.5s"
