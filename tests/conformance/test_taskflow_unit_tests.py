"""TaskFlow's own unit tests keep passing on flowengine: never fewer per module than recorded.

One child process runs TaskFlow 6.5's public-behaviour, jobboard and conductor test modules on
flowengine, imports renamed (see ``taskflow_unit_tests``; the boards against the real Redis,
ZooKeeper and etcd servers), and this test fails when any module passes fewer tests than the
floor recorded in ``taskflow_unit_counts.json``. The session's summary prints the counts. When
a change makes more pass, raise the floors: ``python -m conformance.taskflow_unit_tests
--record`` from ``tests/``, and name in that file, with why, each TaskFlow test that still
fails on flowengine.
"""

from __future__ import annotations

from importlib import metadata

import pytest
from servers import require_module

from . import compared
from .taskflow_unit_tests import MODULES, internal_tests, recorded, run, unnamed_failures

for _extra in ("taskflow", "oslotest", "testscenarios"):
    require_module(_extra)

# One child process runs about a thousand of TaskFlow's tests against real servers: 68-134 s
# measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(600)


def test_taskflow_unit_tests_pass_no_less_than_recorded(
        redis_url: str, zookeeper_hosts: str, etcd_endpoint: tuple[str, int]) -> None:
    counts = recorded()
    installed = metadata.version("taskflow")
    assert installed.startswith(counts["taskflow_version"] + "."), (
        f"the counts were recorded with TaskFlow {counts['taskflow_version']}, and TaskFlow"
        f" {installed} is installed: measure again (see taskflow_unit_tests)")
    outcome = run("flowengine")
    passed = outcome.counts()
    floors = {module: counts["modules"][module]["flowengine"] for module in MODULES}
    on_taskflow = {module: counts["modules"][module]["taskflow"] for module in MODULES}
    compared.UNIT_COUNTS[:] = [
        f"{module}: {passed[module]} passed (floor {floors[module]}, TaskFlow"
        f" {on_taskflow[module]})" for module in MODULES]
    total, of = sum(passed.values()), sum(on_taskflow.values())
    internal = internal_tests(counts)
    compared.UNIT_COUNTS.append(
        f"total: {total} of TaskFlow's {of} ({total / of:.1%}; of the {of - internal} not"
        f" testing TaskFlow's internals, {total / (of - internal):.1%}) in"
        f" {outcome.seconds:.0f}s")
    unnamed = unnamed_failures(outcome, counts)
    if unnamed:
        compared.UNIT_COUNTS.append("failing and not named in taskflow_unit_counts.json: "
                                    + ", ".join(unnamed))
    below = [f"{module}: {passed[module]} < {floors[module]}" for module in MODULES
             if passed[module] < floors[module]]
    assert not below, ("fewer of TaskFlow's tests pass than recorded: " + "; ".join(below)
                       + "\nfailing: " + ", ".join(unnamed) + "\n" + outcome.output[-6000:])
