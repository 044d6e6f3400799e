"""Generated TaskFlow programs, as data: flows of tasks with retries, failures and options.

A program is a JSON-like dict (so hypothesis can shrink it and a failure prints it whole):

* ``flow``: a tree of ``{"pattern": "linear"|"unordered"|"graph", "name", "retry", "items"}``
  and tasks ``{"name", "requires", "provides", "rebind", "inject", "fails"}``; a task that
  ``fails`` raises for its first that many executions;
* ``store``: values injected before running;
* ``engine``: ``"serial"`` or ``"parallel"``; ``options``: engine options, ``None`` values
  included (TaskFlow reads ``None`` as the option's default);
* ``suspend_at``: the name of a task whose success suspends the engine (then a second engine
  loaded from the same flow detail resumes it), or ``None``.

Names are drawn so that most programs are valid; some are not on purpose (a task requiring a
name nobody provides, two atoms with one name), and then the error is what is compared.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

RETRIES = ("Times", "ForEach", "ParameterizedForEach", "AlwaysRevert", "AlwaysRevertAll")
PATTERNS = ("linear", "unordered", "graph")
STORE = ("s1", "s2")


@st.composite
def programs(draw: st.DrawFn) -> dict[str, Any]:
    counter = iter(range(1000))
    provided: list[str] = list(STORE)
    tasks: list[str] = []

    def task(parallel_siblings: bool) -> dict[str, Any]:
        index = next(counter)
        name = f"t{index}"
        pool = provided if not parallel_siblings else list(STORE)
        requires = draw(st.lists(st.sampled_from(pool), max_size=2, unique=True))
        if draw(st.integers(0, 19)) == 0:
            requires.append("missing")  # nobody provides it: the flow cannot run
        spec: dict[str, Any] = {"name": name, "requires": requires, "provides": None,
                                "rebind": {}, "inject": {}, "fails": 0}
        if draw(st.booleans()):
            # Now and then a name several tasks provide: which one a consumer reads is compared.
            spec["provides"] = "shared" if draw(st.integers(0, 4)) == 0 else f"v{index}"
        if requires and draw(st.integers(0, 3)) == 0:
            # Read the first argument from another name (a store value).
            spec["rebind"] = {requires[0]: draw(st.sampled_from(STORE))}
        if draw(st.integers(0, 4)) == 0:
            spec["inject"] = {"extra": draw(st.integers(0, 9))}
        spec["fails"] = draw(st.sampled_from((0, 0, 0, 0, 1, 2, 9)))
        if draw(st.integers(0, 29)) == 0 and tasks:
            spec["name"] = tasks[0]  # a duplicate atom name
        tasks.append(spec["name"])
        return spec

    def retry() -> dict[str, Any] | None:
        if not draw(st.integers(0, 2)) == 0:
            return None
        kind = draw(st.sampled_from(RETRIES))
        spec: dict[str, Any] = {"type": kind, "name": f"r{next(counter)}",
                                "revert_all": draw(st.booleans()),
                                "provides": draw(st.sampled_from((None, "attempt")))}
        if kind == "Times":
            spec["attempts"] = draw(st.integers(1, 3))
        elif kind == "ForEach":
            spec["values"] = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
        elif kind == "ParameterizedForEach":
            spec["rebind"] = ["s_values"]
        return spec

    def flow(depth: int) -> dict[str, Any]:
        pattern = draw(st.sampled_from(PATTERNS))
        node: dict[str, Any] = {"pattern": pattern, "name": f"f{next(counter)}", "retry": retry(),
                                "items": []}
        for _ in range(draw(st.integers(1, 3))):
            if depth < 2 and draw(st.integers(0, 3)) == 0:
                item = flow(depth + 1)
            else:
                item = task(parallel_siblings=pattern == "unordered")
            node["items"].append(item)
            if "pattern" not in item and item["provides"]:
                provided.append(item["provides"])
        return node

    root = flow(0)
    bools = st.sampled_from((None, False, True))
    options = {"defer_reverts": draw(bools), "never_resolve": draw(bools),
               "inject_transient": draw(bools)}
    options = {k: v for k, v in options.items() if draw(st.booleans())}
    engine = draw(st.sampled_from(("serial", "parallel")))
    # Where a suspension catches concurrently running atoms is timing, not behaviour.
    suspend_at = draw(st.sampled_from([None, None, *sorted(set(tasks))])) \
        if engine == "serial" else None
    return {"flow": root, "store": {"s1": 1, "s2": 2, "s_values": [1, 2]},
            "engine": engine, "options": options, "suspend_at": suspend_at}
