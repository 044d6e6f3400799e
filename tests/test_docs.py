"""Build the Sphinx documentation the way CI does: any warning is an error.

This includes the API reference (doc/api), which autodoc generates from the docstrings.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "doc"


@pytest.fixture
def sphinx_available() -> None:
    if importlib.util.find_spec("sphinx") is not None:
        return
    message = "sphinx is not installed; install the 'test' extra: pip install -e '.[test]'"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.mark.timeout(360)  # 24 s on a loaded 2-core machine; above sphinx's own 300 s timeout
@pytest.mark.usefixtures("sphinx_available")
def test_docs_build_without_warnings(tmp_path: pathlib.Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOC), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"
    html = tmp_path / "html"
    built = {str(p.relative_to(html).with_suffix("")) for p in html.rglob("*.html")}
    sources = {str(p.relative_to(DOC).with_suffix("")) for p in DOC.rglob("*.rst")
               if "_build" not in p.parts}
    assert sources <= built, f"pages not built: {sorted(sources - built)}"
    # The API reference really holds the docstrings (autodoc imported every module).
    reference = (html / "api" / "engines.html").read_text()
    assert "SerialActionEngine" in reference and "time_limits" in reference
