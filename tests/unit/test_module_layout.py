"""How flowengine's modules are laid out: kombu stays in one subpackage.

The rule is read from the source (an AST scan), so it holds for modules no test imports.
Modules are sized by what they hold: no line count is enforced (a count is never a reason to
split a concept or to trim one under a number).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "flowengine"
#: The only place in flowengine that may import kombu.
BROKER_PACKAGE = PACKAGE / "worker_based" / "broker"


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


def test_only_the_broker_package_imports_kombu() -> None:
    assert kombu_importers(PACKAGE, BROKER_PACKAGE) == []


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


WORKER_BASED = PACKAGE / "worker_based"
#: The worker-based package's concepts, and what each may not import: the two sides do not
#: reach into each other, and the wire's facts depend on neither.
SIDES: dict[str, set[str]] = {
    "engine_side": {"flowengine.worker_based.worker_side"},
    "worker_side": {"flowengine.worker_based.engine_side"},
    "wire": {"flowengine.worker_based.engine_side", "flowengine.worker_based.worker_side"},
}


def _imported_modules(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def crossings(root: pathlib.Path, sides: dict[str, set[str]]) -> list[str]:
    """``module -> imported`` for each import a side may not make."""
    found = []
    for side, forbidden in sides.items():
        for path in sorted((root / side).rglob("*.py")):
            for name in sorted(_imported_modules(ast.parse(path.read_text(), str(path)))):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    found.append(f"{side}/{path.name} -> {name}")
    return found


def test_the_engine_side_the_worker_side_and_the_wire_stay_apart() -> None:
    assert all((WORKER_BASED / side / "__init__.py").is_file() for side in SIDES)
    assert crossings(WORKER_BASED, SIDES) == []


def test_a_crossing_between_the_sides_is_found(tmp_path: pathlib.Path) -> None:
    for side in SIDES:
        (tmp_path / side).mkdir()
    (tmp_path / "worker_side" / "rogue.py").write_text(
        "from flowengine.worker_based.engine_side import lifecycle\n")
    (tmp_path / "wire" / "fine.py").write_text("from flowengine.worker_based import protocol\n")
    assert crossings(tmp_path, SIDES) == [
        "worker_side/rogue.py -> flowengine.worker_based.engine_side.lifecycle"]


#: Modules outside the broker package that import one of its transport modules, and why. The
#: rest learn transport facts through the broker's traits and the publisher's faces
#: (``disk_watch``, ``delay_receipt``); the test fails on a new one and on a listed one that
#: is gone, so the list only shrinks.
TRANSPORT_IMPORTERS: dict[str, str] = {
    "testing/workers.py": "the testing kit drives its own test double, the severable memory "
                          "transport, to lose a worker the way a killed process is lost",
}


def transport_importers(root: pathlib.Path, broker: pathlib.Path) -> set[str]:
    """The modules under ``root``, outside ``broker``, that import a ``transport_*`` module
    of the broker package (``import``, ``from ... import``, at any depth)."""
    prefix = "flowengine.worker_based.broker.transport_"
    found = set()
    for path in sorted(root.rglob("*.py")):
        if broker in path.parents:
            continue
        names = _imported_modules(ast.parse(path.read_text(), str(path)))
        if any(name.startswith(prefix) for name in names):
            found.add(str(path.relative_to(root)))
    return found


def test_nothing_above_the_broker_package_imports_a_transport_module() -> None:
    assert transport_importers(PACKAGE, BROKER_PACKAGE) == set(TRANSPORT_IMPORTERS)


def test_a_transport_import_above_the_broker_package_is_found(tmp_path: pathlib.Path) -> None:
    broker = tmp_path / "worker_based" / "broker"
    broker.mkdir(parents=True)
    (broker / "publisher.py").write_text(
        "from flowengine.worker_based.broker import transport_fs_disk\n")
    (tmp_path / "worker_based" / "client.py").write_text(
        "def f():\n    from flowengine.worker_based.broker import transport_fs_disk as d\n")
    (tmp_path / "worker_based" / "quiet.py").write_text(
        "from flowengine.worker_based.broker import publisher\n")
    (tmp_path / "rogue.py").write_text(
        "import flowengine.worker_based.broker.transport_beanstalk_delays\n")
    assert transport_importers(tmp_path, broker) == {"worker_based/client.py", "rogue.py"}


#: The modules that make a consumer of a broker (``Broker.consumer``), and why. Everything
#: else reaches a broker through the process's client (``client.borrowed`` for a publish, a
#: browse or a take); the test fails on a new one and on a listed one that is gone, so the list
#: only shrinks.
CONSUMERS: dict[str, str] = {
    "worker_based/client.py": "the process's client: its reply queue",
    "worker_based/server.py": "a worker consumes its topic's queue and its control queue",
}


def calls_to(root: pathlib.Path, called: str) -> set[str]:
    """The modules under ``root`` that call ``called(...)`` or ``x.called(...)``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == called:
                    found.add(str(path.relative_to(root)))
    return found


def test_a_proxy_is_made_from_a_broker_spec_by_the_client_and_the_server_only() -> None:
    assert calls_to(PACKAGE, "Proxy") == {"worker_based/broker_spec.py"}
    assert calls_to(PACKAGE, "consumer") == set(CONSUMERS)


def test_no_test_imports_the_tests_folder_as_a_package() -> None:
    # `make test` puts each test's folder and tests/ itself on sys.path (rootdir conftests),
    # not the checkout: `from tests.x import y` imports only when PYTHONPATH names the
    # checkout, as it does in a developer's shell and not in CI.
    tests = PACKAGE.parent / "tests"
    offenders = [str(path.relative_to(tests)) for path in sorted(tests.rglob("*.py"))
                 if "tests" in _imported_roots(ast.parse(path.read_text(), str(path)))]
    assert offenders == []
