"""Finding a conductor by kind: ``fetch("blocking" | "nonblocking", name, jobboard, ...)``."""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

from flowengine import exceptions as exc
from flowengine.conductors import base

__all__ = ["CONDUCTOR_NAMESPACE", "fetch"]

#: The entry point group searched for conductor kinds flowengine does not know.
CONDUCTOR_NAMESPACE = "flowengine.conductors"

_BUILTIN = {
    "blocking": "flowengine.conductors.backends.impl_blocking:BlockingConductor",
    "nonblocking": "flowengine.conductors.backends.impl_nonblocking:NonBlockingConductor",
}


def fetch(kind: str, name: str, jobboard: Any, namespace: str = CONDUCTOR_NAMESPACE,
          **kwargs: Any) -> base.Conductor:
    """Build a conductor of ``kind`` named ``name`` taking jobs from ``jobboard``.

    Args:
        kind: ``blocking`` or ``nonblocking`` (or an entry point name in ``namespace``).
        name: The conductor's name (its claims' owner).
        jobboard: The board.
        namespace: The entry point group searched for other kinds.
        **kwargs: The conductor's options (``persistence``, ``engine``, ``engine_options``,
            ``wait_timeout``, ``max_simultaneous_jobs``, ``executor_factory``...).

    Raises:
        flowengine.exceptions.NotFound: If no conductor has that kind.
    """
    target = _BUILTIN.get(kind) if namespace == CONDUCTOR_NAMESPACE else None
    if target is None:
        found = [ep for ep in metadata.entry_points(group=namespace) if ep.name == kind]
        if not found:
            raise exc.NotFound(f"No conductor of kind '{kind}'; known: "
                               f"{', '.join(sorted(_BUILTIN))}")
        cls = found[0].load()
    else:
        module_name, _, class_name = target.partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
    conductor: base.Conductor = cls(name, jobboard, **kwargs)
    return conductor
