"""Tracing looks for the OpenTelemetry API without tripping on one another thread is importing.

A conductor runs jobs on threads; one that imports the API (a job carrying a trace) puts
``opentelemetry.trace`` in ``sys.modules`` before its names exist. Another thread looking for a
tracer then read ``get_tracer_provider`` from the half-made module and failed dispatching its
job ("partially initialized module 'opentelemetry.trace' has no attribute ...", seen in a chaos
run of conductors). Here a real import is held half done while tracing is looked for.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest

from flowengine import tracing
from flowengine.tracing import _api

GATE = "half_import_gate"


@pytest.fixture
def held_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module whose import stops half way until the test lets it go: (its name, the gate)."""
    gate = types.SimpleNamespace(entered=threading.Event(), release=threading.Event())
    monkeypatch.setitem(sys.modules, GATE, gate)
    name = f"slow_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import {GATE} as gate
        gate.entered.set()
        assert gate.release.wait(30), "never let go"
        def get_tracer_provider():
            return None
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, gate
    gate.release.set()
    sys.modules.pop(name, None)


def _import_in_thread(name: str) -> threading.Thread:
    importer = threading.Thread(target=__import__, args=(name,), daemon=True)
    importer.start()
    return importer


def test_a_module_being_imported_by_another_thread_is_not_yet_imported(held_import):
    name, gate = held_import
    importer = _import_in_thread(name)
    assert gate.entered.wait(30)
    assert name in sys.modules  # there, half made
    assert _api.imported(name) is None
    gate.release.set()
    importer.join(30)
    assert _api.imported(name) is sys.modules[name]


def test_tracing_is_off_while_the_api_is_half_imported(held_import, monkeypatch):
    name, gate = held_import
    importer = _import_in_thread(name)
    assert gate.entered.wait(30)
    # The half-made module stands where the API would be.
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", sys.modules[name])
    assert tracing.enabled() is False
    tracing.flush()  # does nothing rather than raise
    gate.release.set()
    importer.join(30)
