"""Posting a flow as a job: save its logbook and factory, then post the job.

TaskFlow programs do these steps by hand (a logbook with one flow detail whose ``meta`` names
the flow factory, saved to persistence, then ``board.post(name, book, details)``);
:func:`post_flow` does them in one call, and the ``flowengine jobs post`` command uses it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowengine import engines, tracing
from flowengine.engines import stopping
from flowengine.jobs import base, endings
from flowengine.persistence import base as persistence_base
from flowengine.persistence import models

__all__ = ["post_flow"]


def post_flow(board: base.JobBoard, persistence: persistence_base.Backend,
              flow_factory: str | Callable[..., Any], factory_args: Sequence[Any] = (),
              factory_kwargs: Mapping[str, Any] | None = None,
              store: Mapping[str, Any] | None = None, name: str | None = None,
              priority: base.JobPriority | str = base.JobPriority.NORMAL,
              details: Mapping[str, Any] | None = None,
              deadline: float | None = None,
              clock: Callable[[], float] = time.time) -> base.Job:
    """Save a logbook whose one flow detail is built by ``flow_factory``, and post it.

    Args:
        board: The board to post on.
        persistence: Where the logbook is saved (conductors must read the same one).
        flow_factory: The flow factory, or its import path; conductors import it by name.
        factory_args: Its positional arguments (JSON-ready).
        factory_kwargs: Its keyword arguments (JSON-ready).
        store: The engine's store (JSON-ready), posted as ``details["store"]``.
        name: The job's (and logbook's) name; the factory's name if omitted.
        priority: The job's priority.
        details: More details for the job. With tracing on, the current trace context is
            added under :data:`flowengine.tracing.TRACE_KEY` (unless ``details`` has that key),
            so the conductor's span of the job joins the poster's trace.
        deadline: Seconds from now the flow must be done by, wherever it waits or runs: a
            conductor's engine cancels it (undoing what it did) once they are over. Stored
            with the flow (see :mod:`flowengine.engines.stopping`).
        clock: Seconds since the epoch (the deadline's start).

    Raises:
        ValueError: If the factory cannot be imported back by its name, or the details are not
            JSON-ready.
    """
    shown = str(name or (flow_factory if isinstance(flow_factory, str) else
                         getattr(flow_factory, "__name__", "job")))
    book = models.LogBook(shown)
    flow_detail = models.FlowDetail(shown, str(uuid.uuid4()))
    book.add(flow_detail)
    engines.save_factory_details(flow_detail, flow_factory, factory_args, factory_kwargs)
    if deadline is not None:
        seconds = stopping.deadline_seconds(deadline)
        assert seconds is not None
        flow_detail.meta[stopping.META_DEADLINE] = {"at": clock() + seconds, "seconds": seconds}
    all_details = {**(details or {}), "store": dict(store or {}), "flow_uuid": flow_detail.uuid}
    # The board and the details are kept with the logbook, so that a job the board loses can
    # be found (an orphan) and posted again as it was (see flowengine.jobs.orphans).
    endings.mark_posted(book, board, {k: v for k, v in all_details.items()
                                      if k != tracing.TRACE_KEY},
                        base.JobPriority.convert(priority))
    with contextlib.closing(persistence.get_connection()) as conn:
        conn.save_logbook(book)
    trace = tracing.job_trace()
    if trace:
        all_details.setdefault(tracing.TRACE_KEY, trace)
    return board.post(shown, book, details=all_details, priority=priority)
