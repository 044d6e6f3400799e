"""A worker's concurrency limits: a slot held for each request it runs, across every worker.

``Worker(limits={"RebootHost": 3}, coordination="redis://...")`` (``flowengine worker --limit
RebootHost=3``) runs at most three ``RebootHost`` requests at once among every worker and engine
using that coordination service; ``limits={"topic": 3}`` (``--limit 3``) at most three requests
of the worker's topic, whatever their class. A key names a task class by its short or fully
qualified name; the slot is held under that name, so an engine's ``concurrency={"RebootHost":
3}`` counts against the very same limit (doc/coordination.rst).

A request that must wait is held by the worker unstarted: it is not RUNNING, and the worker
tells its engine what it waits for as a progress event (``update_progress`` with progress 0 and
``waiting_for``), again every heartbeat interval, which a flowengine engine stores (``flowengine
show`` reads it) and takes as a sign of life, so the request does not expire while it waits. A
request revoked or a worker stopping ends the wait: the request is dropped or handed back
unstarted, and its place in line released.

The coordination layer sits above the worker layer, so the service is found by name at run
time (:func:`flowengine.coordination.shared`).
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias

from flowengine.engines.admission import whole_limits
from flowengine.worker_based import extensions as ext

__all__ = ["DEFAULT_INTERVAL", "TOPIC", "CoordinationSpec", "LimitService", "LimitTicket",
           "WorkerLimits", "parse_limits", "waiting_event"]

LOG = logging.getLogger(__name__)

#: The limit key that stands for the worker's own topic.
TOPIC = "topic"
#: Seconds between "still waiting" events when the engine asks for no heartbeats.
DEFAULT_INTERVAL = 2.0


class LimitTicket(Protocol):
    """A place in a limit's line, as the worker uses it (a coordinator's
    :class:`~flowengine.coordination.coordinator.Ticket`)."""

    @property
    def future(self) -> cf.Future[Any]:
        """Done once the place is held; cancelled if it was released while waiting."""

    def waiting_for(self) -> dict[str, Any]:
        """Who holds the limit, and how many wait ahead (told to the request's engine)."""

    def release(self) -> None:
        """Give the place up, held or still waited for."""


class LimitService(Protocol):
    """What a worker needs of its coordination service (a
    :class:`~flowengine.coordination.Coordinator`): typed here by its shape, because the
    coordination layer sits above the worker's and is found by name at run time."""

    def request(self, key: str, limit: int = 1, details: Mapping[str, Any] | None = None, *,
                kind: str | None = None) -> LimitTicket:
        """Join ``key``'s line; the ticket's future is done once it is held."""


#: How a worker names its coordination service: a jobboard URI (``redis://...``), a jobboard
#: conf, or a coordinator itself.
CoordinationSpec: TypeAlias = str | Mapping[str, Any] | LimitService


def parse_limits(values: Mapping[str, Any] | None) -> dict[str, int]:
    """``{key: N}`` checked: each N a whole number >= 1.

    Raises:
        ValueError: Naming the key whose limit is not usable.
    """
    return whole_limits("Worker limits", values or {})


class WorkerLimits:
    """The limits of one worker (see the module).

    Args:
        limits: ``{key: N}``: a task class's name, or ``topic``.
        topic: The worker's topic.
        coordination: A :class:`~flowengine.coordination.Coordinator`, or a jobboard URI or
            conf naming the service.

    Attributes:
        worker_id: The worker's identity, shown to others as the holder (its server sets it).
    """

    def __init__(self, limits: Mapping[str, int] | None, topic: str,
                 coordination: CoordinationSpec | None) -> None:
        self.limits = parse_limits(limits)
        if self.limits and coordination is None:
            raise ValueError(f"Worker on topic '{topic}': limits need a coordination service "
                             f"(coordination='redis://...', the jobboard's service)")
        self._topic = topic
        self.worker_id = ""
        self._conf = coordination
        self._service: LimitService | None = None

    def keys(self, task_cls: str) -> list[tuple[str, int]]:
        """The limits a request for ``task_cls`` counts against, sorted (taken in that order,
        so two workers never each hold one and wait for the other)."""
        short = task_cls.rpartition(".")[2]
        found = {f"topic:{self._topic}" if key == TOPIC else key: limit
                 for key, limit in self.limits.items() if key in (TOPIC, task_cls, short)}
        return sorted(found.items())

    @property
    def service(self) -> LimitService:
        """The process's coordinator (connected on first use)."""
        if self._service is None:
            shared: Callable[[CoordinationSpec | None], LimitService] = (
                importlib.import_module("flowengine.coordination").shared)
            self._service = shared(self._conf)
        return self._service

    def take(self, task_cls: str, task_name: str, interval: float | None,
             still_waiting: Callable[[dict[str, Any]], None],
             give_up: Callable[[], bool]) -> list[LimitTicket] | None:
        """Hold every limit of a request for ``task_cls`` (blocking this thread); the tickets
        to release after it ran, or None if ``give_up()`` said to stop waiting first.

        Args:
            task_cls: The request's task class.
            task_name: Its task's name (shown to others).
            interval: Seconds between ``still_waiting`` calls (None: the default).
            still_waiting: Told what the request waits for, at once and every ``interval``.
            give_up: Asked every ``interval`` whether to stop (revoked, worker stopping).
        """
        held: list[LimitTicket] = []
        for key, limit in self.keys(task_cls):
            ticket = self.service.request(
                key, limit, {"task": task_name, "worker": self.worker_id,
                             "topic": self._topic}, kind="limit")
            held.append(ticket)
            while not ticket.future.done():
                still_waiting(ticket.waiting_for())
                try:
                    ticket.future.result(timeout=interval or DEFAULT_INTERVAL)
                except cf.TimeoutError:
                    if give_up():
                        self.release(held)
                        return None
                except cf.CancelledError:
                    self.release(held)
                    return None
        return held

    @staticmethod
    def release(tickets: list[LimitTicket]) -> None:
        """Release what :meth:`take` held."""
        for ticket in reversed(tickets):
            ticket.release()


def waiting_event(waiting_for: Mapping[str, Any] | None) -> dict[str, Any]:
    """The progress event details telling an engine what its request waits for (None: that it
    no longer waits)."""
    return {"progress": 0.0, ext.WAITING_FOR: dict(waiting_for) if waiting_for else None}

