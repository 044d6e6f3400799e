"""TaskFlow's ``eventlet_utils`` names, for programs that import them.

flowengine never uses eventlet; this module only tells whether it is installed.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EVENTLET_AVAILABLE", "check_for_eventlet"]

#: Whether eventlet can be imported.
EVENTLET_AVAILABLE = importlib.util.find_spec("eventlet") is not None


def check_for_eventlet(exc: Exception | None = None) -> None:
    """Raise ``exc`` (a RuntimeError by default) unless eventlet is installed."""
    if not EVENTLET_AVAILABLE:
        raise exc if exc is not None else RuntimeError("Eventlet is not currently available")
