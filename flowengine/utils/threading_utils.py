"""Thread helpers TaskFlow programs import (``taskflow.utils.threading_utils``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["daemon_thread", "get_ident", "is_alive"]


def daemon_thread(target: Callable[..., Any], *args: Any, **kwargs: Any) -> threading.Thread:
    """An unstarted daemon thread that runs ``target(*args, **kwargs)``."""
    thread = threading.Thread(target=target, args=args, kwargs=kwargs)
    thread.daemon = True
    return thread


def get_ident() -> int:
    """The calling thread's identifier (as :func:`threading.get_ident`)."""
    return threading.get_ident()


def is_alive(thread: threading.Thread) -> bool:
    """Whether ``thread`` is running."""
    return thread.is_alive()
