"""A flow factory whose code a test changes between two runs, as a deploy changes it.

``CODE`` is what the deployed code looks like now: whether the order flow has gained a
``charge`` step, and the version of its steps. ``RAN`` lists the steps executed.
"""

from __future__ import annotations

from typing import Any

from flowengine import task
from flowengine.flows import linear_flow

#: The code as deployed now (the test changes it).
CODE: dict[str, Any] = {"charge": False, "version": (1, 0)}
RAN: list[str] = []


class Step(task.Task):
    """Records that it ran."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.version = CODE["version"]

    def execute(self) -> None:
        RAN.append(self.name)


def make_order() -> Any:
    """reserve -> (charge ->) ship."""
    steps = [Step("reserve"), *([Step("charge")] if CODE["charge"] else []), Step("ship")]
    return linear_flow.Flow("order").add(*steps)
