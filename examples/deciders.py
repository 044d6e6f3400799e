"""Link deciders: a graph flow link that runs its target only when a condition holds.

``inspect`` measures disk usage. The link ``inspect -> clean_up`` carries a decider: clean-up
(and ``compact``, which comes after it) runs only when usage is above 80%. ``report`` does not
depend on the decider and always runs. A skipped atom ends in the IGNORE state; the flow still
succeeds. ``decider_depth`` says how far a "no" reaches: ``ALL`` (the default) skips everything
after the target too, ``ATOM`` skips only the target.

Run: python examples/deciders.py
"""

from typing import Any

from flowengine import engines, task
from flowengine.flows import graph_flow


class Inspect(task.Task):
    def execute(self, measured: int) -> int:
        print(f"inspect: disk is {measured}% full")
        return measured


class Say(task.Task):
    """Prints a message; stands in for real work."""

    def __init__(self, name: str, message: str, requires: tuple[str, ...] = ()) -> None:
        super().__init__(name=name, requires=requires)
        self._message = message

    def execute(self, **kwargs: Any) -> None:
        print(f"{self.name}: {self._message}")


def usage_is_high(history: dict[str, Any]) -> bool:
    """``history`` maps the link's source atom name to its result."""
    return history["inspect"] > 80


def run_once(measured: int, depth: str = "ALL") -> None:
    inspect = Inspect(name="inspect", provides="usage")
    clean_up = Say("clean_up", "removing old logs")
    compact = Say("compact", "compacting the database")
    report = Say("report", "sending the usage report", requires=("usage",))
    flow = graph_flow.Flow("disk-maintenance").add(inspect, clean_up, compact, report)
    flow.link(inspect, clean_up, decider=usage_is_high, decider_depth=depth)
    flow.link(clean_up, compact)
    engine = engines.load(flow, store={"measured": measured})
    engine.run()
    states = {name: engine.storage.get_atom_state(name)
              for name in ("inspect", "clean_up", "compact", "report")}
    print("states: " + ", ".join(f"{name}={state}" for name, state in states.items()))
    print(f"flow state: {engine.storage.get_flow_state()}")


def main() -> None:
    print("== usage 95%: the clean-up branch runs ==")
    run_once(95)
    print("== usage 40%: the decider skips the clean-up branch ==")
    run_once(40)
    print("== usage 40%, decider_depth='ATOM': only clean_up itself is skipped ==")
    run_once(40, depth="ATOM")


if __name__ == "__main__":
    main()
