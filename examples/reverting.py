"""A failing flow: the task that fails stops the flow, and completed work is undone in reverse.

Booking a trip reserves a flight, a hotel and a car, then charges the card. The charge fails, so
the engine reverts the car, the hotel and the flight (the reverse of the order they ran in), and
finally re-raises the card's exception to the caller.

Run: python examples/reverting.py
"""

from typing import Any

from flowengine import engines, task
from flowengine.flows import linear_flow
from flowengine.types.failure import Failure

REVERTED: list[str] = []


class CardDeclined(Exception):
    pass


class Reserve(task.Task):
    """Reserves one thing; its revert cancels that reservation."""

    def execute(self) -> str:
        reference = f"{self.name}-42"
        print(f"execute {self.name}: reserved {reference}")
        return reference

    def revert(self, result: Any, flow_failures: dict[str, Failure], **kwargs: Any) -> None:
        REVERTED.append(self.name)
        cause = next(iter(flow_failures.values()))
        print(f"revert  {self.name}: cancelled {result} (because {cause.exception_str})")


class Charge(task.Task):
    def execute(self, amount: int) -> None:
        print(f"execute {self.name}: charging {amount}")
        raise CardDeclined(f"card declined for {amount}")

    def revert(self, result: Any, **kwargs: Any) -> None:
        # ``result`` is the Failure of this task's own execute.
        REVERTED.append(self.name)
        print(f"revert  {self.name}: nothing to undo ({result.exception_str})")


def main() -> None:
    flow = linear_flow.Flow("book-trip").add(
        Reserve("flight"), Reserve("hotel"), Reserve("car"), Charge("charge")
    )
    engine = engines.load(flow, store={"amount": 1200})
    try:
        engine.run()
    except CardDeclined as err:
        print(f"run raised CardDeclined: {err}")
    print("revert order: " + " -> ".join(REVERTED))
    print(f"flow state: {engine.storage.get_flow_state()}")
    for name in ("flight", "hotel", "car", "charge"):
        print(f"  {name:<7} {engine.storage.get_atom_state(name)}")


if __name__ == "__main__":
    main()
