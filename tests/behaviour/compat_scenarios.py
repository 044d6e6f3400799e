"""Scenario programs run unchanged under TaskFlow and under flowengine.

``python compat_scenarios.py taskflow|flowengine`` imports one library (the only difference is
the import lines, as for a user migrating), runs every scenario on the serial and the parallel
engine and prints one JSON object: ``{"<scenario>[<engine>]": outcome}``. Importing this module
imports neither library, so the test module can read ``SCENARIOS`` from it.

An outcome holds what ran (in order when ``ordered``), the final atom and flow states, what the
flow stored, the exception type (and the messages of wrapped failures) and, for ``ordered``
scenarios, the atom and flow notification sequences.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import types
from collections.abc import Callable
from typing import Any

Build = Callable[[Any, Any], tuple]
#: name -> (build function, whether the execution order is defined on every engine)
SCENARIOS: dict[str, tuple[Build, bool]] = {}
ENGINES = ("serial", "parallel")


def scenario(ordered: bool = True) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        SCENARIOS[build.__name__] = (build, ordered)
        return build
    return register


def load_library(lib: str) -> types.SimpleNamespace:
    if lib == "taskflow":
        from taskflow import deciders, engines, exceptions, retry, task
        from taskflow.patterns import graph_flow, linear_flow, unordered_flow
    elif lib == "flowengine":
        from flowengine import deciders, engines, exceptions, retry, task
        from flowengine.flows import graph_flow, linear_flow, unordered_flow
    else:
        raise SystemExit(f"unknown library {lib!r}")
    return types.SimpleNamespace(lf=linear_flow, uf=unordered_flow, gf=graph_flow,
                                 engines=engines, task=task, retry=retry, exc=exceptions,
                                 deciders=deciders)


def make_tasks(lib: types.SimpleNamespace, ledger: list) -> types.SimpleNamespace:
    """The scenario tasks, built on the library's Task; they append to ``ledger``."""

    class Recording(lib.task.Task):
        def revert(self, *args, result=None, flow_failures=None, **kwargs):
            if hasattr(result, "exception_str"):
                result = "failure: " + result.exception_str
            ledger.append(["revert", self.name, result, sorted(flow_failures or {}),
                           sorted(kwargs.items())])

    class Step(Recording):
        def execute(self):
            ledger.append(["execute", self.name])
            return self.name

    class Constant(Recording):
        def execute(self, value):
            ledger.append(["execute", self.name, value])
            return value

    class Add(Recording):
        def execute(self, x, y):
            ledger.append(["execute", self.name, x, y])
            return x + y

    class Scale(Recording):
        def execute(self, x, factor=10):
            ledger.append(["execute", self.name, x, factor])
            return x * factor

    class Greeting(Recording):
        default_provides = "greeting"

        def execute(self, who):
            ledger.append(["execute", self.name, who])
            return "hello " + who

    class Fail(Recording):
        def execute(self):
            ledger.append(["execute", self.name])
            raise RuntimeError(self.name + " failed")

    class FailUntil(Recording):
        def execute(self, attempt, succeed_at):
            ledger.append(["execute", self.name, attempt])
            if attempt < succeed_at:
                raise RuntimeError(f"{self.name} failed attempt {attempt}")
            return attempt

    class FailOn(Recording):
        def execute(self, value, bad):
            ledger.append(["execute", self.name, value])
            if value in bad:
                raise RuntimeError(f"{self.name} failed with {value}")
            return value

    class RevertFails(lib.task.Task):
        def execute(self):
            ledger.append(["execute", self.name])

        def revert(self, *args, **kwargs):
            ledger.append(["revert", self.name])
            raise ValueError(self.name + " revert failed")

    class Progress(Recording):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.notifier.register(lib.task.EVENT_UPDATE_PROGRESS, lambda event, details:
                                   ledger.append(["progress", self.name, details["progress"]]))

        def execute(self):
            ledger.append(["execute", self.name])
            self.update_progress(0.5)

    return types.SimpleNamespace(**{cls.__name__: cls for cls in (
        Step, Constant, Add, Scale, Greeting, Fail, FailUntil, FailOn, RevertFails, Progress)})


# ---- scenarios: each returns (flow, store, engine options[, drive(engine, ledger)]) ------------
# Without ``drive`` the engine runs once through ``run_iter``.


@scenario()
def linear_results(lib, t):
    flow = lib.lf.Flow("root").add(t.Constant("one", provides="x", inject={"value": 1}),
                                   t.Scale("scale", provides="y"),
                                   t.Add("sum", provides="total"))
    return flow, None, {}


@scenario(ordered=False)
def unordered_and_graph(lib, t):
    graph = lib.gf.Flow("g").add(t.Scale("late", rebind={"x": "mid"}, provides="out"),
                                 t.Add("mid", rebind=["a", "a"], provides="mid"))
    flow = lib.lf.Flow("root").add(lib.uf.Flow("u").add(t.Step("s1"), t.Step("s2")), graph)
    return flow, {"a": 2}, {}


@scenario()
def arguments(lib, t):
    flow = lib.lf.Flow("root").add(
        t.Add("rebind-dict", rebind={"x": "p", "y": "q"}, provides="r1"),
        t.Add("rebind-list", rebind=["q", "p"], provides="r2"),
        t.Add("injected", inject={"x": 100}, provides="r3"),
        t.Scale("optional-default", rebind={"x": "p"}, provides="r4"),
        t.Greeting("default-provides"),
        t.Constant("tuple", provides=("t1", "t2"), inject={"value": [1, 2]}),
        t.Constant("set", provides={"k1", "k2"}, inject={"value": {"k1": 1, "k2": 2, "k3": 3}}),
    )
    return flow, {"p": 1, "q": 2, "y": 3, "who": "ann"}, {}


@scenario()
def store_and_atom_provide_same_name(lib, t):
    flow = lib.lf.Flow("root").add(t.Constant("maker", provides="x", inject={"value": 5}),
                                   t.Scale("user", provides="out"))
    return flow, {"x": 1}, {}


def _decider_flow(lib, t, depth):
    a, b, c, d = t.Step("a"), t.Step("b"), t.Step("c"), t.Step("d")
    inner = lib.lf.Flow("inner").add(t.Step("e"))
    graph = lib.gf.Flow("g").add(a, b, c, d, inner)
    graph.link(a, b, decider=lambda history: history["a"] != "a", decider_depth=depth)
    graph.link(b, c)
    graph.link(c, d)
    graph.link(c, inner)
    return lib.lf.Flow("root").add(graph, t.Step("after")), None, {}


@scenario()
def decider_depth_all(lib, t):
    return _decider_flow(lib, t, lib.deciders.Depth.ALL)


@scenario(ordered=False)
def decider_depth_flow(lib, t):
    return _decider_flow(lib, t, lib.deciders.Depth.FLOW)


@scenario(ordered=False)
def decider_depth_neighbors(lib, t):
    return _decider_flow(lib, t, lib.deciders.Depth.NEIGHBORS)


@scenario(ordered=False)
def decider_depth_atom(lib, t):
    return _decider_flow(lib, t, "atom")


@scenario()
def decider_ignored_atom_gets_no_vote(lib, t):
    a, b, c = t.Step("a"), t.Step("b"), t.Step("c")
    graph = lib.gf.Flow("g").add(a, b, c)
    graph.link(a, b, decider=lambda history: False, decider_depth="ATOM")
    graph.link(b, c, decider=lambda history: False, decider_depth="ATOM")
    return graph, None, {}


@scenario(ordered=False)
def decider_into_subflow(lib, t):
    a = t.Step("a")
    sub = lib.lf.Flow("sub").add(t.Step("s1"), t.Step("s2"))
    graph = lib.gf.Flow("g").add(a, sub, t.Step("free"))
    graph.link(a, sub, decider=lambda history: False)
    return graph, None, {}


@scenario()
def targeted(lib, t):
    flow = lib.gf.TargetedFlow("tf")
    seed = t.Constant("seed", provides="x", inject={"value": 2})
    target = t.Scale("target", provides="y")
    flow.add(seed, target, t.Step("other"), t.Scale("down", rebind={"x": "y"}, provides="z"))
    flow.set_target(target)
    return flow, None, {}


@scenario()
def revert_in_reverse_order(lib, t):
    flow = lib.lf.Flow("root").add(
        t.Step("a"), t.Add("b", rebind={"x": "p", "y": "p"}, provides="b_out"),
        lib.lf.Flow("inner").add(t.Step("c"), t.Fail("boom")), t.Step("never"))
    return flow, {"p": 1}, {}


@scenario()
def revert_failure(lib, t):
    flow = lib.lf.Flow("root").add(t.Step("a"), t.RevertFails("bad-revert"), t.Fail("boom"))
    return flow, None, {}


@scenario(ordered=False)
def two_failures_at_once(lib, t):
    return lib.uf.Flow("u").add(t.Fail("f1"), t.Fail("f2")), None, {}


@scenario()
def times_succeeds_on_third(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.Times(3, provides="attempt")).add(
        t.Step("a"), t.FailUntil("flaky", inject={"succeed_at": 3}))
    return flow, None, {}


@scenario()
def times_exhausted(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.Times(2, provides="attempt")).add(
        t.Step("a"), t.Fail("boom"))
    return lib.lf.Flow("root").add(t.Step("outside"), flow), None, {}


@scenario()
def times_revert_all_nested(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.Times(2, revert_all=True, name="r-in")).add(
        t.Fail("boom"))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(3, name="r-out")).add(t.Step("a"), inner)
    return outer, None, {}


@scenario()
def times_revert_nested(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.Times(2, name="r-in")).add(t.Fail("boom"))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(3, name="r-out")).add(t.Step("a"), inner)
    return outer, None, {}


@scenario()
def nested_times_outer_retries_inner(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.Times(2, name="r-in")).add(
        t.FailUntil("flaky", rebind={"attempt": "outer_attempt"}, inject={"succeed_at": 2}))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(3, name="r-out",
                                                       provides="outer_attempt"))
    return outer.add(t.Step("a"), inner), None, {}


@scenario()
def for_each(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.ForEach([1, 2, 3], provides="value")).add(
        t.FailOn("picky", inject={"bad": [1, 2]}))
    return flow, None, {}


@scenario()
def for_each_exhausted_revert_all(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.ForEach(["a", "b"], provides="value",
                                                         revert_all=True))
    inner.add(t.FailOn("picky", inject={"bad": ["a", "b"]}))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(3)).add(t.Step("first"), inner)
    return outer, None, {}


@scenario()
def parameterized_for_each(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.ParameterizedForEach(
        rebind={"values": "choices"}, provides="value"))
    flow.add(t.FailOn("picky", inject={"bad": ["x"]}))
    return flow, {"choices": ["x", "y", "z"]}, {}


@scenario()
def always_revert_defers_to_outer(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.AlwaysRevert("ar")).add(
        t.FailUntil("flaky", inject={"succeed_at": 2}))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(2, name="t", provides="attempt"))
    return outer.add(t.Step("a"), inner), None, {}


@scenario()
def always_revert_all_skips_outer(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.AlwaysRevertAll("ara")).add(t.Fail("boom"))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(5, name="t")).add(t.Step("a"), inner)
    return outer, None, {}


@scenario()
def defer_reverts(lib, t):
    inner = lib.lf.Flow("inner", retry=lib.retry.Times(2, name="r-in")).add(t.Fail("boom"))
    outer = lib.lf.Flow("outer", retry=lib.retry.Times(2, name="r-out")).add(t.Step("a"), inner)
    return outer, None, {"defer_reverts": True}


@scenario()
def never_resolve(lib, t):
    flow = lib.lf.Flow("r", retry=lib.retry.Times(3)).add(t.Step("a"), t.Fail("boom"))
    return flow, None, {"never_resolve": True}


@scenario()
def missing_dependency(lib, t):
    return lib.lf.Flow("root").add(t.Add("needs-y", inject={"x": 1})), None, {}


@scenario()
def rebind_to_missing_name(lib, t):
    return lib.lf.Flow("root").add(t.Scale("s", rebind={"x": "nowhere"})), None, {}


@scenario()
def several_missing(lib, t):
    flow = lib.lf.Flow("root").add(t.Add("needs-x-y"), t.Scale("needs-x", rebind={"x": "w"}))
    return flow, None, {}


@scenario()
def consumer_before_producer(lib, t):
    flow = lib.lf.Flow("root").add(t.Scale("consumer"),
                                   t.Constant("producer", provides="x", inject={"value": 1}))
    return flow, None, {}


@scenario()
def unordered_sibling_dependency(lib, t):
    flow = lib.uf.Flow("u").add(t.Constant("producer", provides="x", inject={"value": 1}),
                                t.Scale("consumer"))
    return flow, None, {}


@scenario()
def same_atom_in_two_subflows(lib, t):
    shared = t.Step("shared")
    flow = lib.lf.Flow("root").add(lib.lf.Flow("a").add(shared), lib.lf.Flow("b").add(shared))
    return flow, None, {}


@scenario()
def duplicate_names(lib, t):
    return lib.lf.Flow("root").add(t.Step("same"), t.Step("same")), None, {}


@scenario()
def ambiguous_provider(lib, t):
    flow = lib.gf.Flow("g").add(t.Constant("p1", provides="x", inject={"value": 1}),
                                t.Constant("p2", provides="x", inject={"value": 2}))
    flow.add(t.Scale("user"))
    return flow, None, {}


@scenario()
def graph_cycle(lib, t):
    a, b = t.Step("a"), t.Step("b")
    flow = lib.gf.Flow("g").add(a, b)
    flow.link(a, b)
    flow.link(b, a)
    return flow, None, {}


@scenario()
def non_atom_item(lib, t):
    return lib.lf.Flow("root").add(t.Step("a"), "not an atom"), None, {}


@scenario()
def progress(lib, t):
    return lib.lf.Flow("root").add(t.Progress("p"), t.Step("a")), None, {}


def _suspend_once(engine, ledger, after):
    iterator = engine.run_iter()
    next(iterator)
    while True:
        try:
            iterator.send(any(e[:2] == ["execute", after] for e in ledger))
        except StopIteration:
            return


@scenario()
def suspend_and_resume(lib, t):
    def drive(engine, ledger):
        _suspend_once(engine, ledger, "a")
        ledger.append(["state", engine.storage.get_flow_state()])
        engine.run()

    flow = lib.lf.Flow("root").add(t.Step("a"), t.Step("b"), t.Step("c"))
    return flow, None, {}, drive


@scenario()
def suspend_while_reverting(lib, t):
    def drive(engine, ledger):
        def suspend(state, details):
            if details.get("task_name") == "boom":
                engine.suspend()
        engine.atom_notifier.register("REVERTED", suspend)
        engine.run()
        ledger.append(["state", engine.storage.get_flow_state()])
        engine.atom_notifier.deregister("REVERTED", suspend)
        engine.run()

    flow = lib.lf.Flow("root").add(t.Step("a"), t.Step("b"), t.Fail("boom"))
    return flow, None, {}, drive


@scenario()
def reset_and_run_again(lib, t):
    def drive(engine, ledger):
        engine.run()
        engine.reset()
        ledger.append(["state", engine.storage.get_flow_state()])
        engine.run()

    return lib.lf.Flow("root").add(t.Step("a"), t.Step("b")), None, {}, drive


@scenario()
def run_reverted_flow_again(lib, t):
    def drive(engine, ledger):
        try:
            engine.run()
        except RuntimeError:
            ledger.append(["state", engine.storage.get_flow_state()])
        engine.run()

    return lib.lf.Flow("root").add(t.Step("a"), t.Fail("boom")), None, {}, drive


# ---- running ------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr, sort_keys=True))


def _error(err: BaseException) -> dict[str, Any]:
    causes = sorted(f.exception_str for f in err) if type(err).__name__ == "WrappedFailure" else []
    return {"type": type(err).__name__, "causes": causes}


def atom_names(flow: Any) -> list[str]:
    """Names of every atom in ``flow`` (retry controllers included), depth first."""
    if not hasattr(flow, "iter_links"):
        return [flow.name] if hasattr(flow, "name") else []
    found = [flow.retry.name] if flow.retry is not None else []
    for item in flow:
        found.extend(atom_names(item))
    return found


_POOL: list[concurrent.futures.ThreadPoolExecutor] = []


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    return _POOL[0]


def _state_of(storage: Any, name: str) -> str | None:
    try:
        return storage.get_atom_state(name)
    except Exception:  # NotFound: the flow never compiled, so nothing was stored
        return None


def run_one(lib: types.SimpleNamespace, name: str, engine_kind: str) -> dict[str, Any]:
    build, ordered = SCENARIOS[name]
    ledger: list = []
    atom_events: list = []
    flow_events: list = []
    out: dict[str, Any] = {"error": None}
    try:
        built = build(lib, make_tasks(lib, ledger))
        flow, store, options = built[:3]
        if engine_kind == "parallel":
            # TaskFlow's own pool costs a fixed second per run to shut down; a given one is kept.
            options = {"executor": _pool(), **options}
        engine = lib.engines.load(flow, store=store, engine=engine_kind, **options)
    except Exception as err:
        out["error"] = _error(err)
        return out
    engine.notifier.register("*", lambda state, details: flow_events.append(state))
    engine.atom_notifier.register("*", lambda state, details: atom_events.append(
        [details.get("task_name") or details.get("retry_name"), state]))
    drive = built[3] if len(built) > 3 else None
    iterated = None
    try:
        if drive is None:
            iterated = list(engine.run_iter())
        else:
            drive(engine, ledger)
    except Exception as err:
        out["error"] = _error(err)
    storage = engine.storage
    out["atom_states"] = {n: _state_of(storage, n) for n in atom_names(flow)}
    out["flow_state"] = storage.get_flow_state()
    out["fetch_all"] = storage.fetch_all()
    out["ledger"] = ledger if ordered else sorted(ledger, key=repr)
    out["statistics_keys"] = sorted(engine.statistics)
    if ordered:
        # 'incomplete' is left out: flowengine differs there (reported as an engine bug).
        out["statistics"] = {k: v for k, v in engine.statistics.items()
                             if k in ("completed", "discarded_failures", "awaiting")}
        out["atom_events"] = _sort_ignore_runs(atom_events)
        out["flow_events"] = flow_events
        out["run_iter"] = iterated
    else:
        out["atom_events"] = sorted(atom_events)
        out["flow_events"] = flow_events[-1:]
        # Which failures a revert sees depends on which failure was processed first.
        out["ledger"] = [e[:3] + [len(e[3])] + e[4:] if e[0] == "revert" and len(e) > 3 else e
                         for e in out["ledger"]]
    return _jsonable(out)


def _sort_ignore_runs(events: list) -> list:
    """Atoms a decider ignores are announced in one batch, in no defined order."""
    found: list = []
    run: list = []
    for event in events + [None]:
        if event is not None and event[1] == "IGNORE":
            run.append(event)
            continue
        found.extend(sorted(run))
        run = []
        if event is not None:
            found.append(event)
    return found


def main(argv: list[str]) -> int:
    lib = load_library(argv[1])
    results = {}
    for name in SCENARIOS:
        for engine_kind in ENGINES:
            results[f"{name}[{engine_kind}]"] = run_one(lib, name, engine_kind)
    json.dump(results, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
