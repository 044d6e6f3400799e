"""Tasks and a flow factory the install checks run: importable by workers and conductors."""

from flowengine import task
from flowengine.flows import linear_flow


class Add(task.Task):
    """Adds ``x`` and ``y``."""

    def execute(self, x: int, y: int) -> int:
        return x + y


class Double(task.Task):
    """Doubles ``total``."""

    def execute(self, total: int) -> int:
        return total * 2


def make_flow() -> linear_flow.Flow:
    """``(x + y) * 2``, as ``doubled``."""
    return linear_flow.Flow("install-check").add(Add(provides="total"),
                                                 Double(provides="doubled"))
