"""Run one generated program on one library and record everything it can observe.

The program is built from the library's own modules (``taskflow.*`` or their flowengine
renames), run through ``engines.load``, and the outcome is a JSON value: the error (type, every
class it can be caught as, message), what the tasks were called with, the ordered atom and flow
notifications, final atom states, storage contents, the persisted atom records and the ``str`` of
every atom and flow. A suspended program is resumed by a second engine loaded from the same flow
detail, and the resumed run is recorded the same way.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import json
import re
import types
from typing import Any

_MODULES = {
    "engines": "engines", "task": "task", "retry": "retry", "exceptions": "exceptions",
    "lf": "{flows}.linear_flow", "uf": "{flows}.unordered_flow", "gf": "{flows}.graph_flow",
    "impl_memory": "persistence.backends.impl_memory", "p_utils": "utils.persistence_utils",
}

#: The parallel engines' executor: one thread, so which atoms overlap is not down to timing.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1)


def library(name: str) -> types.SimpleNamespace:
    """The modules a program uses, from ``taskflow`` or ``flowengine``."""
    flows = "patterns" if name == "taskflow" else "flows"
    return types.SimpleNamespace(**{
        key: importlib.import_module(f"{name}.{path.format(flows=flows)}")
        for key, path in _MODULES.items()})


def _tasks(lib: types.SimpleNamespace, ledger: list, attempts: dict[str, int]) -> type:
    class Job(lib.task.Task):
        """Returns its name and arguments; fails its first ``fails`` executions."""

        def __init__(self, spec: dict[str, Any]) -> None:
            self.fails = spec["fails"]
            super().__init__(name=spec["name"], provides=spec["provides"],
                             requires=spec["requires"] + sorted(spec["inject"]),
                             rebind=spec["rebind"] or None, inject=spec["inject"] or None)

        def execute(self, **kwargs: Any) -> Any:
            count = attempts[self.name] = attempts.get(self.name, 0) + 1
            ledger.append(["execute", self.name, sorted(kwargs.items())])
            self.update_progress(0.5)
            if count <= self.fails:
                raise RuntimeError(f"{self.name} failed #{count}")
            return f"{self.name}:{sorted(kwargs.values(), key=repr)}"

        def revert(self, *args: Any, **kwargs: Any) -> None:
            result = kwargs.pop("result", None)
            failures = kwargs.pop("flow_failures", None) or {}
            if hasattr(result, "exception_str"):
                result = "failure: " + result.exception_str
            ledger.append(["revert", self.name, result, sorted(failures),
                           sorted(kwargs.items())])

    return Job


def _retry(lib: types.SimpleNamespace, spec: dict[str, Any]) -> Any:
    kind = getattr(lib.retry, spec["type"])
    kwargs: dict[str, Any] = {"name": spec["name"], "provides": spec["provides"]}
    if spec["type"] == "Times":
        kwargs.update(attempts=spec["attempts"], revert_all=spec["revert_all"])
    elif spec["type"] == "ForEach":
        kwargs.update(values=spec["values"], revert_all=spec["revert_all"])
    elif spec["type"] == "ParameterizedForEach":
        kwargs.update(rebind=spec["rebind"], revert_all=spec["revert_all"])
    return kind(**kwargs)


def build(lib: types.SimpleNamespace, job: type, spec: dict[str, Any]) -> Any:
    if "pattern" not in spec:
        return job(spec)
    module = {"linear": lib.lf, "unordered": lib.uf, "graph": lib.gf}[spec["pattern"]]
    retry = _retry(lib, spec["retry"]) if spec["retry"] else None
    flow = module.Flow(spec["name"], retry=retry)
    for item in spec["items"]:
        flow.add(build(lib, job, item))
    return flow


def _atoms(flow: Any) -> list[Any]:
    if not hasattr(flow, "iter_links"):
        return [flow]
    found = [flow.retry] if flow.retry is not None else []
    for item in flow:
        found.extend(_atoms(item))
    return found


def _flows(flow: Any) -> list[Any]:
    if not hasattr(flow, "iter_links"):
        return []
    found = [flow]
    for item in flow:
        found.extend(_flows(item))
    return found


def _message(err: BaseException) -> str:
    # Addresses and uuids are random; the rest of the message is compared.
    text = re.sub(r"0x[0-9a-f]+", "0x?", str(err))
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", text)


def error(err: BaseException) -> dict[str, Any]:
    causes = []
    if type(err).__name__ == "WrappedFailure":
        causes = sorted(f.exception_str for f in err)
    catchable = sorted({cls.__name__ for cls in type(err).__mro__} - {"object", "BaseException"})
    return {"type": type(err).__name__, "catchable_as": catchable, "message": _message(err),
            "causes": causes}


def _failure_text(value: Any) -> Any:
    """A failure dict by its text (its traceback names the library's own files)."""
    if isinstance(value, dict) and "exc_type_names" in value:
        return "failure: " + value["exception_str"]
    return value


def _records(lib: types.SimpleNamespace, backend: Any, fd_uuid: str) -> dict[str, Any]:
    """The persisted atom records, by atom name (uuids and tracebacks left out: random)."""
    conn = backend.get_connection()
    found = {}
    for ad in conn.get_flow_details(fd_uuid):
        record = ad.to_dict()
        record.pop("uuid")
        for key in ("failure", "revert_failure"):
            if record[key]:
                record[key] = {k: record[key][k] for k in ("exception_str", "exc_type_names")}
        if isinstance(record.get("results"), dict):  # the injector's values
            record["results"] = repr(record["results"])
        elif type(ad).__name__ == "RetryDetail":  # a history: (result, {atom: failure dict})
            record["results"] = [[_failure_text(data), {name: _failure_text(failure)
                                                        for name, failure in failures.items()}]
                                 for data, failures in record["results"] or ()]
        found[ad.name] = record
    return found


def _value(value: Any) -> Any:
    """A stored value; a Failure by its text (its repr differs: TaskFlow's is the default)."""
    if isinstance(value, list):
        return [_value(item) for item in value]
    if hasattr(value, "exception_str") and hasattr(value, "check"):
        return "failure: " + value.exception_str
    return value


def _state(storage: Any, name: str) -> Any:
    try:
        return storage.get_atom_state(name)
    except Exception as err:  # NotFound: the flow never compiled, so nothing was stored
        return error(err)["type"]


def _run(engine: Any, events: dict[str, list]) -> None:
    events["run_iter"] = list(engine.run_iter())


def run_program(name: str, program: dict[str, Any]) -> dict[str, Any]:
    """Run ``program`` on library ``name``; return what it observed, as JSON values."""
    lib = library(name)
    ledger: list = []
    out: dict[str, Any] = {"error": None}
    try:
        flow = build(lib, _tasks(lib, ledger, {}), program["flow"])
        out["str"] = [str(a) for a in _atoms(flow)] + [str(f) for f in _flows(flow)]
        out["requires"] = sorted(flow.requires)
        out["provides"] = sorted(flow.provides)
    except Exception as err:
        out["error"] = error(err)
        return out
    backend = lib.impl_memory.MemoryBackend()
    book = lib.p_utils.temporary_log_book(backend)
    fd = lib.p_utils.create_flow_detail(flow, book=book, backend=backend)
    options = dict(program["options"])
    if program["engine"] == "parallel":
        options["executor"] = _POOL  # a pool of TaskFlow's own takes a second to shut down
    runs = []
    for attempt in range(2):
        run: dict[str, Any] = {"atom_events": [], "flow_events": [], "error": None}
        runs.append(run)
        try:
            engine = lib.engines.load(flow, store=program["store"] if attempt == 0 else None,
                                      flow_detail=fd, backend=backend,
                                      engine=program["engine"], **options)
        except Exception as err:
            run["error"] = error(err)
            break
        suspend_at = program["suspend_at"] if attempt == 0 else None

        def on_atom(state: str, details: dict[str, Any], engine: Any = engine,
                    run: dict[str, Any] = run, suspend_at: str | None = suspend_at) -> None:
            atom = details.get("task_name") or details.get("retry_name")
            run["atom_events"].append([atom, state])
            if atom == suspend_at and state == "SUCCESS":
                engine.suspend()

        engine.atom_notifier.register("*", on_atom)
        engine.notifier.register("*", lambda state, details, run=run:
                                 run["flow_events"].append(state))
        try:
            _run(engine, run)
        except Exception as err:
            run["error"] = error(err)
        storage = engine.storage
        run["flow_state"] = storage.get_flow_state()
        run["fetch_all"] = {name: _value(value) for name, value in storage.fetch_all().items()}
        run["atom_states"] = {a.name: _state(storage, a.name) for a in _atoms(flow)}
        run["records"] = _records(lib, backend, fd.uuid)
        if run["flow_state"] != "SUSPENDED":
            break
    out["runs"] = runs
    out["ledger"] = ledger
    return json.loads(json.dumps(out, default=repr, sort_keys=True))
