"""The nonblocking conductor: runs up to ``max_simultaneous_jobs`` jobs at once on threads."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import futurist

from flowengine.conductors.backends import impl_executor

__all__ = ["NonBlockingConductor"]


class NonBlockingConductor(impl_executor.ExecutorConductor):
    """An :class:`~.impl_executor.ExecutorConductor` running jobs on a thread pool.

    Args:
        executor_factory: Makes the executor (called with the conductor, or with no argument,
            as TaskFlow allows); default: a thread pool of ``max_simultaneous_jobs`` threads.
        **kwargs: As for :class:`~.impl_executor.ExecutorConductor`.
    """

    MAX_SIMULTANEOUS_JOBS = min(32, (os.cpu_count() or 1) + 4)

    def __init__(self, name: str, jobboard: Any, persistence: Any = None,
                 engine: str | None = None, engine_options: dict[str, Any] | None = None,
                 wait_timeout: float | None = None, log: Any = None,
                 max_simultaneous_jobs: int = MAX_SIMULTANEOUS_JOBS,
                 executor_factory: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        super().__init__(name, jobboard, persistence=persistence, engine=engine,
                         engine_options=engine_options, wait_timeout=wait_timeout, log=log,
                         max_simultaneous_jobs=max_simultaneous_jobs, **kwargs)
        if executor_factory is not None and not callable(executor_factory):
            raise ValueError(f"Conductor {name}: executor_factory must be callable")
        self._make_executor = executor_factory

    def _executor_factory(self) -> Any:
        if self._make_executor is None:
            workers = self._max_simultaneous_jobs if self._max_simultaneous_jobs > 0 else 32
            return futurist.ThreadPoolExecutor(max_workers=workers)
        try:
            return self._make_executor(self)
        except TypeError:
            return self._make_executor()
