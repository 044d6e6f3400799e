"""Stored flow records whose saved factory is hostile: rebuilding one would write a marker file.

A record names its flow factory by import path, with arguments; whoever can write a record or
post a job chooses both. Every record here would create ``marker`` if any process imported and
called its factory: ``os.system``, ``subprocess.call``, a stdlib function re-exported from an
innocent-looking module (:mod:`hostile_reexports`), and ``flowengine run``'s own rebuilder made
to name ``os:system``. Tests store them and check the marker never appears.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

from flowengine import states
from flowengine.persistence import base, models


def hostile_factories(marker: Path) -> dict[str, dict[str, Any]]:
    """Factory details (``meta["factory"]``) by a short name, each touching ``marker``."""
    touch = f"touch {marker}"
    return {
        "os-system": {"name": "os.system", "args": [touch], "kwargs": {}},
        "subprocess-call": {"name": "subprocess.call", "args": [["touch", str(marker)]],
                            "kwargs": {}},
        "re-exported": {"name": "hostile_reexports.system", "args": [touch], "kwargs": {}},
        "laundered": {"name": "flowengine.cli.loading.flow_from_spec",
                      "args": ["os:system", [touch], {}], "kwargs": {}},
    }


def store_hostile(backend: base.Backend, name: str, factory: dict[str, Any],
                  state: str = states.SUSPENDED) -> models.LogBook:
    """Save a logbook with one flow detail (one PENDING task) whose factory is ``factory``."""
    book = models.LogBook(f"hostile-{name}")
    flow_detail = models.FlowDetail(f"hostile-{name}", str(uuid.uuid4()))
    flow_detail.state = state
    flow_detail.meta = {"factory": factory}
    atom = models.TaskDetail("innocent-looking", str(uuid.uuid4()))
    atom.state = states.PENDING
    flow_detail.add(atom)
    book.add(flow_detail)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)
    return book
