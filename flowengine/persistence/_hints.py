"""The commands an error about a store's layout tells the operator to run.

Every refusal of a store (an older flowengine schema, a TaskFlow store, a directory missing its
folders) ends with the one command that gets past it, spelled with the store's own URL
(password masked) so it can be pasted.
"""

from __future__ import annotations

import shlex


def upgrade_hint(url: str) -> str:
    """``run: flowengine db upgrade --backend URL`` (and the Python call that does the same)."""
    return (f"run: flowengine db upgrade --backend {shlex.quote(url)}"
            " (from Python: Connection.upgrade())")


def import_hint(url: str) -> str:
    """How to copy the TaskFlow store at ``url`` into a flowengine store of its own."""
    return (f"copy it into a flowengine store with: flowengine db import-taskflow --from"
            f" {shlex.quote(url)} --backend NEW_URL (another database or PostgreSQL schema:"
            " the table names are the same)")
