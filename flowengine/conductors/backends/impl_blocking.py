"""The blocking conductor: runs one job at a time, on the thread that called ``run``."""

from __future__ import annotations

from typing import Any

import futurist

from flowengine.conductors.backends import impl_executor

__all__ = ["BlockingConductor"]


class BlockingConductor(impl_executor.ExecutorConductor):
    """An :class:`~.impl_executor.ExecutorConductor` that runs jobs inline, one at a time.

    Same arguments as :class:`~.impl_executor.ExecutorConductor` (``max_simultaneous_jobs``
    defaults to 1, as in TaskFlow).
    """

    MAX_SIMULTANEOUS_JOBS = 1

    def __init__(self, name: str, jobboard: Any, persistence: Any = None,
                 engine: str | None = None, engine_options: dict[str, Any] | None = None,
                 wait_timeout: float | None = None, log: Any = None,
                 max_simultaneous_jobs: int = MAX_SIMULTANEOUS_JOBS, **kwargs: Any) -> None:
        super().__init__(name, jobboard, persistence=persistence, engine=engine,
                         engine_options=engine_options, wait_timeout=wait_timeout, log=log,
                         max_simultaneous_jobs=max_simultaneous_jobs, **kwargs)

    def _executor_factory(self) -> Any:
        return futurist.SynchronousExecutor()
