"""A graph flow whose order comes only from what each task requires and provides.

The tasks are added in a scrambled order and no link is declared: the graph flow links each
task after the task that provides what it requires.

Run: python examples/graph_inferred.py
"""

from flowengine import engines, task
from flowengine.flows import graph_flow

ORDER: list[str] = []


class Step(task.Task):
    """Records that it ran and provides a short string built from its inputs."""

    def execute(self, **inputs: str) -> str:
        ORDER.append(self.name)
        return f"{self.name}({', '.join(sorted(inputs))})"


def step(name: str, requires: tuple[str, ...] = ()) -> Step:
    return Step(name=name, provides=name, requires=requires)


# What each step needs, by the names other steps provide.
NEEDS = {
    "publish": ("test", "package"),
    "package": ("compile",),
    "test": ("compile",),
    "compile": ("fetch_source", "fetch_deps"),
    "fetch_deps": (),
    "fetch_source": (),
}


def main() -> None:
    flow = graph_flow.Flow("build").add(*(step(name, needs) for name, needs in NEEDS.items()))
    links = sorted((u.name, v.name) for u, v, _meta in flow.iter_links())
    for before, after in links:
        print(f"inferred link: {before} -> {after}")
    results = engines.run(flow)
    print("execution order: " + " -> ".join(ORDER))
    for name, needs in NEEDS.items():
        assert all(ORDER.index(dep) < ORDER.index(name) for dep in needs), name
    print("every step ran after the steps it needs")
    print(f"publish returned {results['publish']!r}")


if __name__ == "__main__":
    main()
