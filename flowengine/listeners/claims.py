"""A listener that checks, on every flow and task state change, that a job is still claimed.

TaskFlow's :class:`CheckingClaimListener`. flowengine's conductors do not need it: they keep
their claims alive and fence a lost job's writes themselves (see
:mod:`flowengine.conductors.claims`); it is here for programs that run claimed jobs by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.listeners import base

__all__ = ["CheckingClaimListener"]

LOG = logging.getLogger(__name__)

JobLossHandler = Callable[[Any, str, dict[str, Any]], None]


class CheckingClaimListener(base.Listener):
    """Calls ``on_job_loss(engine, state, details)`` when ``owner`` no longer holds ``job``.

    Args:
        engine: The engine running the job.
        job: The claimed job.
        board: Its jobboard.
        owner: Who claimed it.
        on_job_loss: What to do on loss (default: suspend the engine).

    Raises:
        ValueError: If ``on_job_loss`` is not callable.
    """

    def __init__(self, engine: Any, job: Any, board: Any, owner: str,
                 on_job_loss: JobLossHandler | None = None) -> None:
        super().__init__(engine)
        if on_job_loss is not None and not callable(on_job_loss):
            raise ValueError("Custom 'on_job_loss' handler must be callable")
        self._job = job
        self._board = board
        self._owner = owner
        self._on_job_loss: JobLossHandler = on_job_loss or self._suspend_engine_on_loss

    def _suspend_engine_on_loss(self, engine: Any, state: str, details: dict[str, Any]) -> None:
        try:
            engine.suspend()
        except exc.TaskFlowException as err:
            LOG.warning("Failed suspending the engine of job %s (owned by %s): %s",
                        self._job.uuid, self._owner, err)

    def _flow_receiver(self, state: str, details: dict[str, Any]) -> None:
        self._claim_checker(state, details)

    def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
        self._claim_checker(state, details)

    def _has_been_lost(self) -> bool:
        try:
            job_state = self._job.state
            owner = self._board.find_owner(self._job)
        except (exc.NotFound, exc.JobFailure):
            return True
        return bool(job_state == states.UNCLAIMED or owner != self._owner)

    def _claim_checker(self, state: str, details: dict[str, Any]) -> None:
        if not self._has_been_lost():
            LOG.debug("Job %s is still claimed by %s", self._job.uuid, self._owner)
            return
        LOG.warning("Job %s has lost its claim (was owned by %s)", self._job.uuid, self._owner)
        self._on_job_loss(self._engine, state, details)
