"""The pytest plugin's fixtures (a user enables them with ``pytest_plugins``; here they are
imported, which registers them for this module alone)."""

from __future__ import annotations

from collections.abc import Callable

import kit_tasks as kt  # tests/testkit is on sys.path (pytest rootdir insertion)

from flowengine.testing import TestKit
from flowengine.testing.pytest_plugin import flow_kit, make_flow_kit  # noqa: F401 - fixtures


def test_flow_kit_is_an_open_worker_based_kit(flow_kit: TestKit) -> None:  # noqa: F811
    assert flow_kit.engine == "worker-based"
    assert flow_kit.run(kt.booking(), store={"seat": "1A"}).state == "SUCCESS"


def test_make_flow_kit_builds_kits_one_at_a_time(
        make_flow_kit: Callable[..., TestKit]) -> None:  # noqa: F811
    first = make_flow_kit(engine="serial")
    assert first.run(kt.booking(), store={"seat": "1A"}).state == "SUCCESS"
    second = make_flow_kit(engine="parallel")  # the first is closed for it
    second.fail_execute("ticket")
    assert second.run(kt.booking(), store={"seat": "1A"}).state == "REVERTED"
