"""Engine options: one program, any engine, and a misspelt option caught before anything runs.

Part 1 runs the same flow on the serial and parallel engines with the same options, among them
a TaskFlow worker-based option the local engines have no use for (accepted and ignored, as
TaskFlow does). Part 2 misspells ``never_resolve``: every engine refuses it, naming the option
it meant.

Run: python examples/engine_options.py
"""

from flowengine import engines, task
from flowengine.flows import linear_flow


class Greet(task.Task):
    def execute(self) -> str:
        return "hello"


def main() -> None:
    options = {"defer_reverts": False, "max_workers": 2, "transition_timeout": None}
    for engine in ("serial", "parallel"):
        flow = linear_flow.Flow("greeting").add(Greet("greet", provides="greeting"))
        print(f"{engine}: {engines.run(flow, engine=engine, **options)['greeting']}")

    flow = linear_flow.Flow("greeting").add(Greet("greet"))
    try:
        engines.load(flow, engine="serial", nevr_resolve=True)
    except ValueError as err:
        print(f"refused: {err}")


if __name__ == "__main__":
    main()
