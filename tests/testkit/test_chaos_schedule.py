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
