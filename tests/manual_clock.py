"""A clock tests move by hand, for code that takes its clock as an argument."""

from __future__ import annotations


class ManualClock:
    """Returns ``now``, which moves only when a test sets it or calls :meth:`advance`."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds
