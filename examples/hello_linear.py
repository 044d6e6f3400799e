"""A linear flow: three tasks run one after another, each using what the one before provided.

Run: python examples/hello_linear.py
"""

from flowengine import engines, task
from flowengine.flows import linear_flow


class Greet(task.Task):
    default_provides = "greeting"

    def execute(self, name: str) -> str:
        print(f"greet: building a greeting for {name}")
        return f"Hello, {name}"


class Shout(task.Task):
    default_provides = "shouted"

    def execute(self, greeting: str) -> str:
        print(f"shout: turning {greeting!r} up")
        return greeting.upper() + "!"


class Show(task.Task):
    def execute(self, shouted: str) -> None:
        print(f"show: {shouted}")


def main() -> None:
    flow = linear_flow.Flow("hello").add(Greet(), Shout(), Show())
    # ``store`` seeds storage: Greet's ``name`` argument is looked up there by name.
    results = engines.run(flow, store={"name": "world"})
    print(f"results: greeting={results['greeting']!r} shouted={results['shouted']!r}")


if __name__ == "__main__":
    main()
