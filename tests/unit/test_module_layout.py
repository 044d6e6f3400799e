"""How flowengine's modules are laid out: kombu stays in one subpackage, modules stay small.

Both rules are read from the source (an AST scan and line counts), so they hold for modules no
test imports.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "flowengine"
#: The only place in flowengine that may import kombu.
BROKER_PACKAGE = PACKAGE / "worker_based" / "broker"
MAX_LINES = 500
#: How a longer module states its reason, e.g. storage.py's "This module is about 650 lines
#: because ..." or protocol.py's "... longer than most, because ...".
STATED_REASON = re.compile(r"(about \d+ lines|longer than most)\W[^.]*\bbecause\b")


def _imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):  # imports inside functions count too
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def kombu_importers(root: pathlib.Path, broker: pathlib.Path) -> list[str]:
    """The modules under ``root``, outside ``broker``, that import kombu."""
    return [str(path.relative_to(root)) for path in sorted(root.rglob("*.py"))
            if broker not in path.parents
            and "kombu" in _imported_roots(ast.parse(path.read_text(), str(path)))]


def oversized(root: pathlib.Path) -> list[str]:
    """The modules under ``root`` over :data:`MAX_LINES` lines whose docstring gives no reason."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n")
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text, str(path))) or ""
        if not STATED_REASON.search(" ".join(doc.split())):
            found.append(f"{path.relative_to(root)} ({lines} lines)")
    return found


def test_only_the_broker_package_imports_kombu() -> None:
    assert kombu_importers(PACKAGE, BROKER_PACKAGE) == []


def test_no_module_is_over_500_lines_without_a_stated_reason() -> None:
    assert oversized(PACKAGE) == []


def test_the_broker_package_does_import_kombu() -> None:
    # The scan above would pass vacuously if the package moved or the AST walk missed imports.
    assert kombu_importers(BROKER_PACKAGE, PACKAGE / "elsewhere") != []


@pytest.mark.parametrize("source", [
    "import kombu\n",
    "from kombu.transport import virtual\n",
    "def f():\n    import kombu.exceptions\n",
])
def test_a_kombu_import_outside_the_broker_package_is_found(tmp_path: pathlib.Path,
                                                            source: str) -> None:
    (tmp_path / "broker").mkdir()
    (tmp_path / "broker" / "edge.py").write_text("import kombu\n")
    (tmp_path / "quiet.py").write_text("import json\nfrom . import kombu_names\n")
    (tmp_path / "rogue.py").write_text(source)
    assert kombu_importers(tmp_path, tmp_path / "broker") == ["rogue.py"]


@pytest.mark.parametrize(("doc", "flagged"), [
    ('"""Short."""\n', True),
    ('"""Long.\n\nThis module is about 650 lines because it carries an API.\n"""\n', False),
    ('"""Long.\n\nKept in one module, longer than most,\nbecause programs import it.\n"""\n',
     False),
    ('"""Long: longer than most."""\n', True),
])
def test_an_oversized_module_needs_a_stated_reason(tmp_path: pathlib.Path, doc: str,
                                                   flagged: bool) -> None:
    (tmp_path / "long.py").write_text(doc + "x = 1\n" * MAX_LINES)
    (tmp_path / "short.py").write_text('"""Short."""\n' + "x = 1\n" * (MAX_LINES - 1))
    assert oversized(tmp_path) == (["long.py (501 lines)"] if flagged else [])
