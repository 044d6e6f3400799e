"""Pins the public names of every public module, so an API change is always deliberate.

After an intended change, regenerate the pinned list with::

    .venv/bin/python tests/unit/test_public_api.py --update
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pathlib
import sys
import types

import pytest

PINNED = pathlib.Path(__file__).with_name("public_api.json")

# The modules a TaskFlow user imports (after the renames) and flowengine's additions.
PUBLIC_MODULES = [
    "flowengine.atom",
    "flowengine.task",
    "flowengine.retry",
    "flowengine.flow",
    "flowengine.flows.linear_flow",
    "flowengine.flows.unordered_flow",
    "flowengine.flows.graph_flow",
    "flowengine.deciders",
    "flowengine.engines",
    "flowengine.hooks",
    "flowengine.states",
    "flowengine.exceptions",
    "flowengine.formatters",
    "flowengine.storage",
    "flowengine.types.failure",
    "flowengine.types.notifier",
    "flowengine.listeners.base",
    "flowengine.listeners.logging",
    "flowengine.listeners.printing",
    "flowengine.listeners.timing",
    "flowengine.listeners.capturing",
    "flowengine.persistence.models",
    "flowengine.persistence.backends",
    "flowengine.persistence.queries",
    "flowengine.utils.persistence_utils",
    # flowengine's worker-based engine and its additions
    "flowengine.worker_based.worker",
    "flowengine.worker_based.engine",
    "flowengine.worker_based.executor",
    "flowengine.worker_based.protocol",
    "flowengine.worker_based.dead_letters",
    "flowengine.worker_based.events",
    "flowengine.worker_based.event_listener",
    "flowengine.worker_based.metrics",
    "flowengine.listeners.atoms",
    "flowengine.secrets",
    "flowengine.dashboard",
    "flowengine.tracing",
    "flowengine.testing",
    "flowengine.context",
    "flowengine.engines.repair",
    # jobboards and conductors (TaskFlow's modules) and their additions
    "flowengine.jobs.base",
    "flowengine.jobs.records",
    "flowengine.jobs.backends",
    "flowengine.jobs.backends.impl_redis",
    "flowengine.jobs.backends.impl_zookeeper",
    "flowengine.jobs.backends.impl_etcd",
    "flowengine.jobs.posting",
    "flowengine.jobs.endings",
    "flowengine.jobs.orphans",
    "flowengine.jobs.masking",
    "flowengine.engines.factory_policy",
    "flowengine.conductors.base",
    "flowengine.conductors.backends",
    "flowengine.conductors.backends.impl_blocking",
    "flowengine.conductors.backends.impl_nonblocking",
    "flowengine.conductors.backends.impl_executor",
    "flowengine.conductors.claims",
    "flowengine.listeners.claims",
    # locks, limits and resuming across code changes
    "flowengine.coordination",
    "flowengine.migrations",
    "flowengine.types.entity",
    "flowengine.utils.redis_utils",
    "flowengine.utils.kazoo_utils",
    "flowengine.utils.threading_utils",
    "flowengine.utils.eventlet_utils",
    "flowengine.logging",
]


def _defined_names(module: types.ModuleType) -> set[str]:
    """Names a module's own source binds at top level (imports excluded)."""
    tree = ast.parse(inspect.getsource(module))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    return found


def public_names(module_name: str) -> list[str]:
    """Public names a module defines (``__all__`` when it declares one)."""
    module = importlib.import_module(module_name)
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return sorted(declared)
    own = _defined_names(module)
    return sorted(n for n in own if not n.startswith("_") and n not in {"LOG"})


def current_api() -> dict[str, list[str]]:
    """Every public module's public names."""
    found = {}
    for name in PUBLIC_MODULES:
        try:
            found[name] = public_names(name)
        except ImportError:
            found[name] = ["<missing module>"]
    return found


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_names_are_pinned(module_name: str) -> None:
    pinned = json.loads(PINNED.read_text())
    assert module_name in pinned, f"{module_name} is not pinned; run this file with --update"
    assert public_names(module_name) == pinned[module_name], (
        f"The public names of {module_name} changed; if deliberate, run "
        f"'python tests/unit/test_public_api.py --update'"
    )


def test_taskflow_names_are_present() -> None:
    """The names a TaskFlow program uses exist under flowengine's package."""
    expected = {
        "flowengine.engines": {"load", "run", "load_from_factory", "save_factory_details",
                               "flow_from_detail", "load_from_detail", "SerialActionEngine",
                               "ParallelActionEngine"},
        "flowengine.task": {"Task", "FunctorTask", "MapFunctorTask", "ReduceFunctorTask",
                            "EVENT_UPDATE_PROGRESS"},
        "flowengine.retry": {"Retry", "History", "Times", "ForEach", "ParameterizedForEach",
                             "AlwaysRevert", "AlwaysRevertAll", "RETRY", "REVERT", "REVERT_ALL",
                             "EXECUTE_REVERT_HISTORY", "REVERT_FLOW_FAILURES", "Decision"},
        "flowengine.deciders": {"Depth", "pick_widest"},
        "flowengine.flows.graph_flow": {"Flow", "TargetedFlow"},
        "flowengine.types.failure": {"Failure"},
        "flowengine.types.notifier": {"Notifier", "RestrictedNotifier"},
        "flowengine.storage": {"Storage"},
        "flowengine.worker_based.worker": {"Worker"},
        "flowengine.worker_based.engine": {"WorkerBasedActionEngine"},
        "flowengine.worker_based.executor": {"WorkerTaskExecutor"},
        "flowengine.worker_based.protocol": {"Request", "Response", "Notify",
                                             "failure_to_dict"},
        "flowengine.persistence.backends": {"fetch", "backend"},
        "flowengine.utils.persistence_utils": {"temporary_log_book", "temporary_flow_detail",
                                               "create_flow_detail"},
    }
    for module_name, names in expected.items():
        module = importlib.import_module(module_name)
        missing = {n for n in names if not hasattr(module, n)}
        assert not missing, f"{module_name} lacks {sorted(missing)}"



# TaskFlow's module -> flowengine's: every public name TaskFlow's defines, flowengine's has too.
TASKFLOW_MODULES = {
    "taskflow.task": "flowengine.task",
    "taskflow.atom": "flowengine.atom",
    "taskflow.retry": "flowengine.retry",
    "taskflow.flow": "flowengine.flow",
    "taskflow.deciders": "flowengine.deciders",
    "taskflow.patterns.linear_flow": "flowengine.flows.linear_flow",
    "taskflow.patterns.unordered_flow": "flowengine.flows.unordered_flow",
    "taskflow.patterns.graph_flow": "flowengine.flows.graph_flow",
}


@pytest.mark.parametrize("theirs", sorted(TASKFLOW_MODULES))
def test_module_level_names_match_taskflow(theirs: str) -> None:
    taskflow_module = importlib.import_module(theirs)  # a test dependency
    ours = importlib.import_module(TASKFLOW_MODULES[theirs])
    names = {name for name, value in vars(taskflow_module).items()
             if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    missing = sorted(name for name in names if not hasattr(ours, name))
    assert not missing, f"{ours.__name__} lacks {missing}, which {theirs} has"
    for name in names:
        value = getattr(taskflow_module, name)
        if isinstance(value, (str, int, tuple)):
            assert getattr(ours, name) == value, f"{ours.__name__}.{name} differs from {theirs}'s"

if __name__ == "__main__":
    if "--update" in sys.argv:
        PINNED.write_text(json.dumps(current_api(), indent=2, sort_keys=True) + "\n")
        print(f"wrote {PINNED}")
    else:
        print(json.dumps(current_api(), indent=2, sort_keys=True))
