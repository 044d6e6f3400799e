"""pytest fixtures of the test kit: enable with ``pytest_plugins =
["flowengine.testing.pytest_plugin"]`` in a ``conftest.py``.

``flow_kit``: a :class:`~flowengine.testing.TestKit` (worker-based engine, two in-process
workers) open for the test and closed after it. ``make_flow_kit``: builds kits with other
options (``make_flow_kit(engine="serial")``), each closed after the test; one is open at a
time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

try:
    import pytest
except ImportError as err:  # pragma: no cover - the extra is what provides it
    raise ImportError("flowengine.testing.pytest_plugin needs pytest: install the 'testing' "
                      "extra (pip install 'flowengine[testing]')") from err

from flowengine.testing.kit import TestKit


@pytest.fixture
def flow_kit() -> Iterator[TestKit]:
    """A test kit for this test: worker-based engine, two workers, a skipping clock."""
    with TestKit() as kit:
        yield kit


@pytest.fixture
def make_flow_kit() -> Iterator[Callable[..., TestKit]]:
    """Builds an open test kit from ``TestKit``'s arguments; closes it after the test."""
    made: list[TestKit] = []

    def make(**options: Any) -> TestKit:
        for kit in made:
            kit.close()  # one kit at a time
        kit = TestKit(**options)
        kit.start()
        made.append(kit)
        return kit

    yield make
    for kit in made:
        kit.close()
