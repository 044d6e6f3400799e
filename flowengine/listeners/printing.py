"""A listener that prints an engine's flow and task state changes to stdout or stderr."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from flowengine.listeners import base

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine

__all__ = ["PrintingListener"]


class PrintingListener(base.DumpingListener):
    """Prints every flow and task state change (and a failed task's traceback).

    Args:
        engine: The engine to listen to.
        task_listen_for: Task states to print.
        flow_listen_for: Flow states to print.
        retry_listen_for: Retry states to listen for (retry changes are not printed).
        stderr: Print to ``sys.stderr`` instead of ``sys.stdout``.
    """

    def __init__(
        self,
        engine: ActionEngine,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        stderr: bool = False,
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        self._stderr = stderr

    @property
    def _file(self) -> TextIO:
        # Looked up when printing, not when built, so that redirecting sys.stdout/stderr later
        # (contextlib.redirect_stdout, test capture) is honoured.
        return sys.stderr if self._stderr else sys.stdout

    def _dump(self, message: str, *args: Any, **kwargs: Any) -> None:
        out = self._file
        print(message % args, file=out)
        exc_info = kwargs.get("exc_info")
        if exc_info is not None:
            traceback.print_exception(exc_info[0], exc_info[1], exc_info[2], file=out)
