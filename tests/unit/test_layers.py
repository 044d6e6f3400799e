"""The package's layers: no module imports a layer above its own, but for the debts listed here.

Each top-level module or package of ``flowengine`` has a layer; an import (at module level or
inside a function: a lazy import is a dependency all the same) may reach its own layer or one
below. An upward import that the design still carries is listed in :data:`DEBTS` with why; the
test fails on a new one, and on a listed one that is gone, so the list only shrinks.
"""

from __future__ import annotations

import ast
import pathlib

import flowengine

PACKAGE = pathlib.Path(flowengine.__file__).parent

#: Bottom to top.
LAYERS: list[set[str]] = [
    {"__version__", "exceptions", "logging", "secrets", "states", "types", "utils"},
    {"atom", "context", "deciders", "flow", "flows", "providers", "retry", "task"},
    {"persistence", "storage"},
    {"engines", "hooks"},
    {"formatters", "listeners", "migrations", "tracing"},
    {"worker_based"},
    {"conductors", "coordination", "jobs"},
    {"cli", "dashboard", "testing"},
]

#: Upward imports the design still has: (importer, imported) -> why.
DEBTS: dict[tuple[str, str], str] = {
    ("utils", "persistence"): "utils.persistence_utils is TaskFlow's module of that name, kept "
                              "for programs that import it",
    ("context", "tracing"): "a task's context carries the current trace (imported lazily)",
}


def _layer(name: str) -> int:
    for rank, members in enumerate(LAYERS):
        if name in members:
            return rank
    raise AssertionError(f"flowengine.{name} has no layer: add it to LAYERS")


def _top(path: pathlib.Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imported(tree: ast.AST) -> set[str]:
    """The top-level flowengine names ``tree`` imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "flowengine":  # from flowengine import tracing
                modules += [f"flowengine.{alias.name}" for alias in node.names]
        found.update(m.split(".")[1] for m in modules if m.startswith("flowengine."))
    return found


def upward_imports() -> dict[tuple[str, str], list[str]]:
    """Every import of a higher layer: (importer, imported) -> the files that make it."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue  # the package's face re-exports from every layer
        importer = _top(path)
        for imported in _imported(ast.parse(path.read_text(encoding="utf-8"))):
            if imported != importer and _layer(imported) > _layer(importer):
                found.setdefault((importer, imported), []).append(
                    str(path.relative_to(PACKAGE.parent)))
    return found


def test_every_module_has_a_layer() -> None:
    names = {_top(path) for path in PACKAGE.rglob("*.py")} - {"__init__"}
    names |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    for name in sorted(names):
        _layer(name)


def test_no_module_imports_a_layer_above_its_own_but_the_listed_debts() -> None:
    found = upward_imports()
    new = {edge: files for edge, files in found.items() if edge not in DEBTS}
    assert not new, "upward imports (import from a lower layer, or list the debt): " + "; ".join(
        f"{a} -> {b} in {', '.join(files)}" for (a, b), files in sorted(new.items()))
    paid = sorted(set(DEBTS) - set(found))
    assert not paid, f"debts no longer owed, take them off DEBTS: {paid}"


def test_an_upward_import_is_found_even_inside_a_function() -> None:
    tree = ast.parse("def f():\n    from flowengine.worker_based import client\n"
                     "from flowengine import cli, states\n")
    assert _imported(tree) == {"worker_based", "cli", "states"}


def test_the_worker_side_reaches_tracing_only_through_its_hooks() -> None:
    # worker_based sits above tracing, so the layer order alone would allow the import: the
    # design does not (a worker's tracing attaches through flowengine.hooks, as an engine's).
    importers = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in (PACKAGE / "worker_based").rglob("*.py")
        if "tracing" in _imported(ast.parse(path.read_text(encoding="utf-8"))))
    assert not importers, f"worker_based modules import flowengine.tracing: {importers}"
