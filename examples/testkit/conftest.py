"""The order service's test set-up: the test kit's fixtures (``flow_kit``) and fresh fakes."""

from collections.abc import Iterator

import orders
import pytest

pytest_plugins = ["flowengine.testing.pytest_plugin"]


@pytest.fixture(autouse=True)
def fresh_fakes() -> Iterator[None]:
    """Every test starts with the fakes answering normally."""
    orders.payments.busy_for = 0
    orders.courier.hang = False
    orders.courier.answer.clear()
    yield
    orders.courier.answer.set()  # nothing stays blocked after the test
