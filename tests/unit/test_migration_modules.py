"""doc/migration.rst says which of TaskFlow's worker_based modules flowengine provides."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[2] / "doc" / "migration.rst"


def _provided() -> list[str]:
    text = " ".join(PAGE.read_text().split())
    listed = re.search(r"``taskflow\.engines\.worker_based\.\*`` \(([^)]*)\)", text)
    assert listed is not None, "the table row naming the worker_based modules is gone"
    return re.findall(r"``(\w+)``", listed.group(1))


@pytest.mark.parametrize("name", _provided())
def test_each_worker_based_module_the_page_lists_imports(name: str) -> None:
    importlib.import_module(f"flowengine.worker_based.{name}")


@pytest.mark.parametrize("name", ["proxy", "dispatcher"])
def test_the_modules_the_page_says_are_not_provided_do_not_import(name: str) -> None:
    assert f"``flowengine.worker_based.{name}``" in PAGE.read_text()
    with pytest.raises(ImportError):
        importlib.import_module(f"flowengine.worker_based.{name}")
