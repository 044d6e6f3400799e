"""TaskFlow's logging helpers: extra levels and a logger adapter with ``trace``.

Programs written for TaskFlow import ``taskflow.logging``; after the rename they import this.
"""

from __future__ import annotations

import logging as _logging
from typing import Any

__all__ = ["BLATHER", "CRITICAL", "DEBUG", "ERROR", "FATAL", "INFO", "NOTSET", "TRACE", "WARN",
           "WARNING", "getLogger"]

#: Below DEBUG: very verbose tracing.
BLATHER = 5
TRACE = BLATHER

CRITICAL = _logging.CRITICAL
DEBUG = _logging.DEBUG
ERROR = _logging.ERROR
FATAL = _logging.FATAL
INFO = _logging.INFO
NOTSET = _logging.NOTSET
WARN = _logging.WARNING
WARNING = _logging.WARNING

_BASE = "flowengine"


class _TraceLoggerAdapter(_logging.LoggerAdapter):  # type: ignore[type-arg]
    def trace(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log at :data:`TRACE`."""
        self.log(TRACE, msg, *args, **kwargs)

    def warn(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log at WARNING (TaskFlow's spelling)."""
        self.warning(msg, *args, **kwargs)


def getLogger(name: str = _BASE, extra: dict[str, Any] | None = None) -> _TraceLoggerAdapter:  # noqa: N802 - TaskFlow's name
    """The logger ``name`` (with a NullHandler if it has none), adapted with :data:`TRACE`."""
    logger = _logging.getLogger(name)
    if not logger.handlers:
        logger.addHandler(_logging.NullHandler())
    return _TraceLoggerAdapter(logger, extra or {})
