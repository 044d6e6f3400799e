"""Pins the public names of every public module, so an API change is always deliberate.

After an intended change, regenerate the pinned list with::

    .venv/bin/python tests/unit/test_public_api.py --update
"""

from __future__ import annotations

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
    "flowengine.utils.persistence_utils",
]


def public_names(module_name: str) -> list[str]:
    """Public names a module defines or re-exports (``__all__`` when it declares one)."""
    module = importlib.import_module(module_name)
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return sorted(declared)
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if name in {"annotations", "TYPE_CHECKING", "LOG"}:
            continue
        origin = getattr(value, "__module__", module_name)
        # Typing helpers and imports from outside flowengine are not part of the API.
        if (inspect.isclass(value) or inspect.isfunction(value)) and not str(origin).startswith(
            "flowengine"
        ):
            continue
        names.append(name)
    return sorted(names)


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
    }
    for module_name, names in expected.items():
        module = importlib.import_module(module_name)
        missing = {n for n in names if not hasattr(module, n)}
        assert not missing, f"{module_name} lacks {sorted(missing)}"


if __name__ == "__main__":
    if "--update" in sys.argv:
        PINNED.write_text(json.dumps(current_api(), indent=2, sort_keys=True) + "\n")
        print(f"wrote {PINNED}")
    else:
        print(json.dumps(current_api(), indent=2, sort_keys=True))
