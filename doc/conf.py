"""Sphinx configuration for the flowengine documentation (build: sphinx-build -W -b html doc out)."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "flowengine"
author = "flowengine contributors"
copyright = "flowengine contributors"
release = version = "0.1.0"

# The API reference (doc/api) is generated from Google-style docstrings.
extensions: list[str] = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Engine classes list their options in an "Options:" section, rendered like "Args:".
napoleon_custom_sections = [("Options", "params_style")]
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
# Python code in literal blocks is highlighted; nothing is fetched over the network.
highlight_language = "python3"
default_role = "literal"

html_theme = "alabaster"
html_title = "flowengine"
html_theme_options = {
    "description": "TaskFlow's API, with remote workers that do not hang.",
    "fixed_sidebar": True,
}
