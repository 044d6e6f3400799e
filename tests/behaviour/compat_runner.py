"""Run the compatibility scenarios under one library and print their outcomes as JSON.

``python -m behaviour.compat_runner taskflow|flowengine`` (from ``tests/``) imports one library
(the only difference is the import lines, as for a user migrating), runs every scenario of
``compat_scenarios`` on the serial and the parallel engine and prints one JSON object:
``{"<scenario>[<engine>]": outcome}``.

An outcome holds what ran (in order unless the scenario's order is "none"), the final atom and flow
states, what the flow stored, the exception (type, the classes it can be caught as, and the
messages of wrapped failures) and the atom and flow notifications (in order, with run_iter
states and statistics counters, when the scenario's order is "all").
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import types
from typing import Any

from .compat_scenarios import ENGINES, SCENARIOS


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


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr, sort_keys=True))


def _error(err: BaseException) -> dict[str, Any]:
    causes = sorted(f.exception_str for f in err) if type(err).__name__ == "WrappedFailure" else []
    # Every class name an ``except`` clause could catch this error by.
    catchable = sorted({cls.__name__ for cls in type(err).__mro__} - {"object", "BaseException"})
    return {"type": type(err).__name__, "catchable_as": catchable, "causes": causes}


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
    build, order = SCENARIOS[name]
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
    out["ledger"] = ledger if order != "none" else sorted(ledger, key=repr)
    out["statistics_keys"] = sorted(engine.statistics)
    if order == "all":
        # 'incomplete' is left out: flowengine differs there (reported as an engine bug).
        out["statistics"] = {k: v for k, v in engine.statistics.items()
                             if k in ("completed", "discarded_failures", "awaiting")}
        out["atom_events"] = _sort_ignore_runs(atom_events)
        out["flow_events"] = flow_events
        out["run_iter"] = iterated
    else:
        out["atom_events"] = sorted(atom_events)
        out["flow_events"] = flow_events[-1:]
    if order == "none":
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
