"""Conductors: claim jobs from a jobboard and run their flows (TaskFlow's API).

A conductor turns a job into an engine: the job's logbook holds the flow detail to run (the
one named by ``details["flow_uuid"]``, or the book's only one), the flow is rebuilt from the
factory saved in that flow detail (if the conductor's factory policy allows it: see
:mod:`flowengine.engines.factory_policy`), and ``details["store"]`` (over the flow detail's
``meta["store"]``) is the engine's store. See :mod:`.backends.impl_executor` for how jobs are
claimed, kept and finished.
"""

from __future__ import annotations

import abc
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.engines.factory_policy import FactoryPolicy
from flowengine.jobs import base as jobs_base
from flowengine.jobs import orphans
from flowengine.persistence import models
from flowengine.types import notifier
from flowengine.types.entity import Entity

__all__ = ["Conductor"]


class Conductor(metaclass=abc.ABCMeta):
    """Claims jobs from a board and runs them in engines.

    Args:
        name: The conductor's name, the owner of its claims (unique among conductors).
        jobboard: The board it takes jobs from.
        persistence: The persistence backend jobs' logbooks are in.
        engine: The engine kind (``serial``, ``parallel``, ``worker-based``...) or URI.
        engine_options: Passed to the engine.
        factory_policy: Which stored flow factories jobs may name (None: the process's,
            :func:`flowengine.engines.factory_policy.current`); a job naming another is
            trashed, saying why.
        coordination: Where the locks of jobs posted with some (``jobs post --lock``) are held:
            a :class:`~flowengine.coordination.Coordinator`, or a jobboard conf or URI (None:
            the board's own service, made on the first job with locks).
    """

    #: The kind of entity a conductor registers as.
    ENTITY_KIND = "conductor"

    def __init__(self, name: str, jobboard: jobs_base.JobBoard, persistence: Any = None,
                 engine: str | None = None, engine_options: dict[str, Any] | None = None,
                 factory_policy: FactoryPolicy | None = None,
                 coordination: Any = None) -> None:
        self._name = name
        self._factory_policy = factory_policy
        self._coordination = coordination
        self._own_coordination: Any = None  # made here from the board: closed here
        self._jobboard = jobboard
        self._persistence = persistence
        self._engine = engine
        self._engine_options = dict(engine_options or {})
        self._lock = threading.RLock()
        self._notifier = notifier.Notifier()
        self._entity: Entity | None = None

    @property
    def name(self) -> str:
        """The conductor's name (the owner of its claims)."""
        return self._name

    @property
    def conductor(self) -> Entity:
        """The entity this conductor registers as (``name@host:pid`` with host, pid, engine and,
        each time it is sent, the logbooks of the jobs it runs)."""
        if self._entity is None:
            host, pid = socket.gethostname(), os.getpid()
            self._entity = _Registration(self.ENTITY_KIND, f"{self._name}@{host}:{pid}",
                                         {"hostname": host, "pid": pid,
                                          "engine": self._engine or "default"}, self._holding)
        return self._entity

    def _holding(self) -> list[str]:
        """The logbooks of the jobs this conductor runs now (see
        :mod:`flowengine.jobs.orphans`: a flow a live conductor holds is no orphan)."""
        return []

    @property
    def notifier(self) -> notifier.Notifier:
        """Announces what the conductor does (see the implementation for the events)."""
        return self._notifier

    def _book_of(self, job: jobs_base.Job) -> models.LogBook:
        # Always what is stored, never a copy cached on the job object: a job claimed again by
        # this process must go on from the record (another conductor may have moved it on, or
        # an engine of ours halted with changes it never wrote).
        book = None
        if self._persistence is not None and job.book_uuid is not None:
            with contextlib.closing(self._persistence.get_connection()) as conn:
                book = conn.get_logbook(job.book_uuid)
        if book is None:
            book = job.book
        if book is None:
            raise exc.NotFound(f"No book found in job {job.uuid} ({job.name})")
        return book

    def _flow_detail_from_job(self, job: jobs_base.Job) -> models.FlowDetail:
        """The flow detail to run: ``details["flow_uuid"]``'s, or the book's only one."""
        book = self._book_of(job)
        flow_uuid = (job.details or {}).get("flow_uuid")
        if flow_uuid is not None:
            flow_detail = book.find(flow_uuid)
            if flow_detail is None:
                raise exc.NotFound(f"No flow detail {flow_uuid} in the book of job {job.uuid}"
                                   f" ({job.name})")
            return flow_detail
        details = list(book)
        if len(details) == 1:
            return details[0]
        if not details:
            raise exc.NotFound(f"No flow detail(s) found in the book of job {job.uuid}")
        raise exc.MultipleChoices(f"No flow_uuid in the details of job {job.uuid} and its book"
                                  f" has {len(details)} flow details")

    def _flow_uuid_of(self, job: jobs_base.Job) -> str:
        """The uuid of the flow detail ``job`` runs, read without loading the flow's atoms
        (its fencing token is recorded before the flow is loaded)."""
        flow_uuid = (job.details or {}).get("flow_uuid")
        if isinstance(flow_uuid, str):
            return flow_uuid
        if self._persistence is not None and job.book_uuid is not None:
            with contextlib.closing(self._persistence.get_connection()) as conn:
                flows = list(conn.get_flows_for_book(job.book_uuid, lazy=True))
            if len(flows) == 1:
                return flows[0].uuid
        # Whatever is missing or ambiguous, the full load says what, as it always has.
        return self._flow_detail_from_job(job).uuid

    def _engine_from_job(self, job: jobs_base.Job, backend: Any = None) -> Any:
        """The engine that runs ``job`` (``backend``: the persistence it writes through)."""
        flow_detail = self._flow_detail_from_job(job)
        store: dict[str, Any] = {}
        store.update((flow_detail.meta or {}).get("store") or {})
        store.update((job.details or {}).get("store") or {})
        kwargs: dict[str, Any] = dict(self._engine_options)
        kwargs.update(self._lock_options(job))
        if self._engine is not None:
            kwargs["engine"] = self._engine
        flow = engines.flow_from_detail(flow_detail, policy=self._factory_policy)
        return engines.load(flow, flow_detail=flow_detail, store=store,
                            backend=backend if backend is not None else self._persistence,
                            **kwargs)

    def _lock_options(self, job: jobs_base.Job) -> dict[str, Any]:
        """Engine options holding the locks ``job`` was posted with (none: no options)."""
        from flowengine import coordination

        locks, on_conflict = coordination.job_locks(job.details)
        if not locks:
            return {}
        with self._lock:
            if self._coordination is None:
                self._coordination = self._own_coordination = coordination.for_board(
                    self._jobboard, owner=self.conductor.name)
        return {"locks": locks, "on_conflict": on_conflict,
                "coordination": self._coordination,
                "lock_details": {"job": job.uuid, "job_name": job.name}}

    def _listeners_from_job(self, job: jobs_base.Job, engine: Any) -> list[Any]:
        """Listeners (entered around the run) to attach to ``job``'s engine; override to add."""
        return []

    def connect(self) -> None:
        """Connect the jobboard if it is not."""
        with self._lock:
            if not self._jobboard.connected:
                self._jobboard.connect()

    def close(self) -> None:
        """Close the jobboard (and the locks' service, if the conductor connected it)."""
        with self._lock:
            if self._own_coordination is not None:
                self._own_coordination.close()
                self._coordination = self._own_coordination = None
            self._jobboard.close()

    @abc.abstractmethod
    def run(self, max_dispatches: int | None = None) -> None:
        """Claim and run jobs until :meth:`stop` (or ``max_dispatches`` jobs were started)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Ask :meth:`run` to return; running jobs are suspended and handed back."""

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`run` returned; False if ``timeout`` passed first."""


class _Registration(Entity):
    """A conductor's registration, whose metadata lists the logbooks it holds when sent."""

    def __init__(self, kind: str, name: str, metadata: dict[str, Any],
                 holding: Callable[[], list[str]]) -> None:
        super().__init__(kind, name, metadata)
        self._holding = holding

    def to_dict(self) -> dict[str, Any]:
        """As :meth:`Entity.to_dict`, with the logbooks held now."""
        found = super().to_dict()
        found["metadata"][orphans.HOLDING_KEY] = self._holding()
        return found

    __hash__ = Entity.__hash__
