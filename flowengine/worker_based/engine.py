"""WorkerBasedActionEngine: an action engine whose tasks run on remote workers.

Retry controllers, scheduling and storage stay in the engine's process; only tasks travel.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from flowengine import states
from flowengine.engines import executor as local
from flowengine.engines.engine import ActionEngine
from flowengine.engines.options import as_bool
from flowengine.types.notifier import register_deregister
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.event_listener import EventListener, PlacementSink
from flowengine.worker_based.events import EventPublisher, combine
from flowengine.worker_based.executor import WorkerTaskExecutor

LOG = logging.getLogger(__name__)


#: Task states after which the worker that ran the task is recorded in its metadata.
_PLACED_STATES = (states.SUCCESS, states.FAILURE, states.REVERTED, states.REVERT_FAILURE)


class WorkerBasedActionEngine(ActionEngine):
    """Runs a flow's tasks on workers reached through a broker.

    Options (as TaskFlow's, plus ``taskflow_compat``):
        exchange: the exchange workers listen on (default ``"default"``).
        url: broker URL (None: the embedded filesystem transport).
        topics: worker topics to ask for workers (flowengine workers also announce themselves).
        transport, transport_options, retry_options: broker settings.
        transition_timeout: seconds a request may wait for a worker to take it (default 60).
        worker_expiry: seconds after which a silent worker is forgotten (default 60).
        executor: a ready-made :class:`WorkerTaskExecutor` to use instead.
        taskflow_compat: declare queues exactly as TaskFlow does (for mixed fleets).
        lease_timeout: seconds a running remote task may go without a heartbeat before it is
            re-dispatched (default 10; None disables leases).
        heartbeat_interval: seconds between worker heartbeats (default 2).
        max_attempts: attempts per task before it fails with WorkerLost (default 3).
        time_limits: ``{task name: seconds}`` overriding tasks' ``time_limit``.
        events: publish events to ``<exchange>.events`` (default True; see doc/operations.rst).
        metrics: update the Prometheus metrics (default False; the ``metrics`` extra).
    """

    def __init__(
        self, flow: Any, flow_detail: Any, backend: Any, options: Mapping[str, Any] | None
    ) -> None:
        super().__init__(flow, flow_detail, backend, options)
        self._worker_executor: local.TaskExecutor | None = None
        extra = self._options.extra
        # A ready-made executor may use a broker the options do not name: publish nowhere then.
        known = self._options.executor is None or extra.get("url") or extra.get("transport")
        self._publisher: ext.EventSink = ext.NO_EVENTS
        if as_bool("events", extra.get("events", True)) and known:
            self._publisher = EventPublisher(
                extra.get("exchange", "default"), url=extra.get("url"),
                transport=extra.get("transport"), transport_options=extra.get("transport_options"))
        self._metrics: ext.EventSink = ext.NO_EVENTS
        if as_bool("metrics", extra.get("metrics", False)):
            from flowengine.worker_based.metrics import MetricsSink

            self._metrics = MetricsSink(role="engine")
        #: ``(attempt, worker)`` of an atom uuid, for the atom log and events.
        self.atom_placement = PlacementSink()

    def run_iter(self, timeout: float | None = None) -> Iterator[str]:
        with self._event_listeners():
            return (yield from super().run_iter(timeout=timeout))

    def _record_placement(self, state: str, details: dict[str, Any]) -> None:
        """Store where a remote task's last attempt ran (``flowengine show`` displays it)."""
        name, uuid = details.get("task_name"), details.get("task_uuid")
        if not name or not uuid:
            return
        attempt, worker = self.atom_placement(uuid)
        if worker is None:
            return
        try:
            self.storage.update_atom_metadata(name, {"worker": worker, "attempts": attempt})
        except Exception:  # a bookkeeping write must not break the run
            LOG.warning("Could not record where task %r ran", name, exc_info=True)

    @contextlib.contextmanager
    def _event_listeners(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for state in _PLACED_STATES:
                stack.enter_context(
                    register_deregister(self.atom_notifier, state, self._record_placement))
            if self._publisher is not ext.NO_EVENTS:
                stack.enter_context(EventListener(self, self._publisher, task_events=False))
            if self._metrics is not ext.NO_EVENTS:
                stack.enter_context(EventListener(self, self._metrics))
            yield

    def _task_executor(self) -> local.TaskExecutor:
        if self._worker_executor is not None:
            return self._worker_executor
        extra = dict(self._options.extra)
        given = self._options.executor
        if given is not None:
            if not isinstance(given, local.TaskExecutor):
                raise TypeError(
                    f"Worker-based engine option 'executor' must be a "
                    f"WorkerTaskExecutor, not {given!r}"
                )
            self._worker_executor = given
            return given
        topics = extra.get("topics") or []
        if isinstance(topics, str):
            topics = [t for t in topics.split(",") if t]
        timeout = extra.get("transition_timeout", pr.REQUEST_TIMEOUT)
        expiry = extra.get("worker_expiry", pr.EXPIRES_AFTER)
        lease = extra.get("lease_timeout", ext.DEFAULT_LEASE_TIMEOUT)
        self._worker_executor = WorkerTaskExecutor(
            uuid=self.storage.flow_uuid,
            exchange=extra.get("exchange", "default"),
            topics=topics,
            transition_timeout=None if timeout is None else float(timeout),
            url=extra.get("url"),
            transport=extra.get("transport"),
            transport_options=extra.get("transport_options"),
            retry_options=extra.get("retry_options"),
            worker_expiry=None if expiry is None else float(expiry),
            taskflow_compat=as_bool("taskflow_compat", extra.get("taskflow_compat", False)),
            lease_timeout=None if lease in (None, "", "none", "None") else float(lease),
            heartbeat_interval=float(extra.get("heartbeat_interval",
                                               ext.DEFAULT_HEARTBEAT_INTERVAL)),
            max_attempts=int(extra.get("max_attempts", ext.DEFAULT_MAX_ATTEMPTS)),
            time_limits=extra.get("time_limits"),
            events=combine(self._publisher, self._metrics, self.atom_placement),
        )
        return self._worker_executor
