"""Prove a flow safe: a test kit for flows, and the judge ``flowengine rehearse`` uses.

Run a flow in a test on a worker-based engine in the test's own process, on a clock that
skips waits, with faults injected, and assert over the ledger of what ran::

    from flowengine.testing import TestKit

    def test_a_failed_charge_releases_the_seat():
        with TestKit() as kit:
            kit.fail_execute("charge")
            outcome = kit.run(booking_flow(), store={"seat": "12A"})
            assert outcome.state == "REVERTED"
            kit.ledger.assert_reverted_in_order("charge", "reserve")

With pytest, ``pytest_plugins = ["flowengine.testing.pytest_plugin"]`` in a ``conftest.py``
gives each test a kit as the ``flow_kit`` fixture. See doc/proving.rst.
"""

from flowengine.testing import effects
from flowengine.testing.clock import ManualClock
from flowengine.testing.faults import (
    Fault,
    InjectedFault,
    fail_execute,
    fail_revert,
    lose_worker,
    revert_twice,
)
from flowengine.testing.judge import Finding
from flowengine.testing.kit import Outcome, TestKit, reverts_without_execute
from flowengine.testing.ledger import Entry, FileLedger, Ledger, MemoryLedger

__all__ = [
    # the kit
    "TestKit",
    "Outcome",
    "ManualClock",
    # faults
    "Fault",
    "InjectedFault",
    "fail_execute",
    "fail_revert",
    "revert_twice",
    "lose_worker",
    "reverts_without_execute",
    # what happened
    "effects",
    "Ledger",
    "MemoryLedger",
    "FileLedger",
    "Entry",
    "Finding",
]
