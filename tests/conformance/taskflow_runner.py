"""Run a copy of TaskFlow's unit tests with pytest, the way TaskFlow's own runner (stestr) does.

``python taskflow_runner.py PYTEST-ARGS...``: the child process ``taskflow_unit_tests`` starts
(with the flowengine under test first on ``PYTHONPATH``). These things differ between stestr and
pytest, or between TaskFlow's CI and this machine, and each would fail tests for reasons that
have nothing to do with the library under test:

* **Scenarios.** ``testscenarios`` multiplies a test class by its ``scenarios`` when the test
  runs; under pytest every clone calls the method bound to the unmultiplied test, which lacks
  the scenario's attributes. Here each scenario becomes a class of its own at collection, named
  ``Class(scenario)``, so each is one test, as stestr counts them.
* **Plain functions.** Only ``TestCase`` methods are tests (TaskFlow's modules hold helpers such
  as ``test_factory`` that pytest would collect).
* **ZooKeeper's version.** TaskFlow asks the server with the ``envi`` four-letter command, which
  a ZooKeeper whose ``4lw.commands.whitelist`` leaves it out refuses (this project's servers
  allow ``stat``); here the client reads the same version from ``stat``.
* **Leftovers.** TaskFlow's ZooKeeper board tests each use a fresh board path, but their trash
  folder is shared (``/taskflow/board-test/.trash``) and never emptied, so a second run on the
  same server finds the first run's trashed ``job0000000000`` there. It is emptied first (only
  these tests use that path).
* **Hangs.** A test waits up to ``WAIT_TIMEOUT`` (300 s) for an event that a broken library never
  sets; that is lowered to :data:`WAIT_TIMEOUT`, so such a test fails within a minute.
* **ZooKeeper sessions.** TaskFlow's tests give their ZooKeeper clients 1 s sessions, which a
  loaded machine (CI's two cores) misses now and then: kazoo drops the connection, and
  flowengine, whose ZooKeeper claims last no longer than their session, loses a claim while its
  conductor is stopping. They get :data:`ZOOKEEPER_SESSION` instead (kazoo's default); no test
  waits for a session to end.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import unittest
from typing import Any

import pytest

#: Seconds a test of TaskFlow's waits for an event before failing (TaskFlow's own: 300).
WAIT_TIMEOUT = 60
#: Seconds of the ZooKeeper sessions TaskFlow's tests open (TaskFlow's own: 1).
ZOOKEEPER_SESSION = 10.0
#: The trash folder every TaskFlow ZooKeeper board test shares.
ZOOKEEPER_TRASH = "/taskflow/board-test/.trash"


def _server_version(client: Any, retries: int = 3) -> tuple[int, ...]:
    """The server's version, read from ``stat`` (``Zookeeper version: 3.8.4-...``)."""
    text = client.command(b"stat")
    found = re.search(r"version: (\d+(?:\.\d+)+)", text)
    if found is None:
        raise RuntimeError(f"ZooKeeper's stat answer names no version: {text[:80]!r}")
    return tuple(int(part) for part in found.group(1).split("."))


def _empty_zookeeper_trash() -> None:
    """Delete what earlier runs left in :data:`ZOOKEEPER_TRASH` (nothing if ZooKeeper is
    missing: the tests then say so themselves)."""
    try:
        from kazoo.client import KazooClient
    except ImportError:
        return
    port = int(os.getenv("TASKFLOW_TEST_ZOOKEEPER_PORT", "2181"))  # TaskFlow's tests' own
    client = KazooClient(hosts=f"localhost:{port}", timeout=5.0)
    with contextlib.suppress(Exception):
        client.start(timeout=5.0)
        try:
            client.delete(ZOOKEEPER_TRASH, recursive=True)
        finally:
            client.stop()
            client.close()


def _adapt_helpers() -> None:
    """Set :data:`WAIT_TIMEOUT` and :data:`ZOOKEEPER_SESSION` in TaskFlow's test helpers
    (``tfconf.tests.utils``, in the working directory) before any test module reads them."""
    sys.path.insert(0, os.getcwd())
    helpers = importlib.import_module("tfconf.tests.utils")
    helpers.WAIT_TIMEOUT = WAIT_TIMEOUT
    helpers.ZK_TEST_CONFIG["timeout"] = ZOOKEEPER_SESSION


class ScenarioClasses:
    """The pytest plugin that collects one test class per scenario of a ``testscenarios``
    class."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makeitem(self, collector: Any, name: str, obj: Any) -> Any:
        if not (isinstance(obj, type) and issubclass(obj, unittest.TestCase)):
            return None
        scenarios = getattr(obj, "scenarios", None)
        if not scenarios:
            return None
        from _pytest.unittest import UnitTestCase

        items = []
        for scenario, parameters in scenarios:
            label = f"{name}({scenario})"
            one = type(label, (obj,), {**parameters, "scenarios": None,
                                       "__module__": obj.__module__})
            setattr(collector.obj, label, one)  # where pytest looks the class up by name
            items.append(UnitTestCase.from_parent(collector, name=label))
        return items


def main(args: list[str]) -> int:
    try:
        from kazoo import client as kazoo_client
    except ImportError:  # the ZooKeeper tests then fail on their own import
        pass
    else:
        kazoo_client.KazooClient.server_version = _server_version  # type: ignore[method-assign]
        _empty_zookeeper_trash()
    _adapt_helpers()
    return int(pytest.main(["-o", "python_functions=__none__", *args],
                           plugins=[ScenarioClasses()]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
