"""The Redis board's timer to the soonest claim end, with an injected clock."""

from __future__ import annotations

from manual_clock import ManualClock

from flowengine.jobs.backends._lease_times import RETRY_AFTER, LeaseTimes


def _never(job_uuids: list[str]) -> list[int]:
    raise AssertionError(f"asked about {job_uuids} before their claims could have ended")


def test_waiters_sleep_until_the_soonest_claim_end() -> None:
    clock = ManualClock()
    leases = LeaseTimes(clock)
    assert leases.next_wakeup(_never) is None
    leases.claimed("a", 3000)
    leases.claimed("b", 1000)
    assert leases.next_wakeup(_never) == 1.0
    clock.advance(0.4)
    assert abs(leases.next_wakeup(_never) - 0.6) < 1e-9
    leases.released("b")
    assert abs(leases.next_wakeup(_never) - 2.6) < 1e-9


def test_an_end_passed_without_news_is_asked_about_once() -> None:
    clock = ManualClock()
    leases = LeaseTimes(clock)
    leases.claimed("renewed", 1000)
    leases.claimed("expired", 1000)
    clock.advance(1.0)
    asked: list[list[str]] = []

    def remaining(job_uuids: list[str]) -> list[int]:
        asked.append(sorted(job_uuids))
        return [2000 if u == "renewed" else -2 for u in job_uuids]

    assert leases.next_wakeup(remaining) == 0.0  # one claim really ended: look now
    assert asked == [["expired", "renewed"]]
    assert leases.next_wakeup(_never) == 2.0  # the renewed one ends 2 s from now


def test_an_unreachable_service_is_asked_again_later() -> None:
    clock = ManualClock()
    leases = LeaseTimes(clock)
    leases.reset({"a": 500, "b": -2})
    clock.advance(1)

    def down(job_uuids: list[str]) -> list[int]:
        raise ConnectionError("down")

    assert leases.next_wakeup(down) == RETRY_AFTER
