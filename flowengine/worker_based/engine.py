"""WorkerBasedActionEngine: an action engine whose tasks run on remote workers.

Retry controllers, scheduling and storage stay in the engine's process; only tasks travel.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flowengine import flow as flow_base
from flowengine import hooks as hk
from flowengine import states
from flowengine.atom import Atom
from flowengine.engines import executor as local
from flowengine.engines.actions import META_ATTEMPT_IDS, META_DELAYED_JOB
from flowengine.engines.engine import ActionEngine
from flowengine.engines.options import TASKFLOW_OPTIONS
from flowengine.exceptions import StorageFailure
from flowengine.persistence.base import Backend
from flowengine.persistence.models import FlowDetail
from flowengine.secrets import Secret
from flowengine.types.notifier import Notifier, register_deregister
from flowengine.utils.cycle_free import WeakMethod
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import remote_control as rc
from flowengine.worker_based import secret_arguments as sa
from flowengine.worker_based.event_listener import EventHook, PlacementSink
from flowengine.worker_based.events import EventPublisher, combine
from flowengine.worker_based.executor import WorkerTaskExecutor
from flowengine.worker_based.options import OPTION_NAMES, WorkerEngineOptions

LOG = logging.getLogger(__name__)


#: Most request ids kept per atom (its first attempt's and those sent again after it).
_MAX_ATTEMPT_IDS = 20
#: Atom states a run that ended (or suspended) never leaves an atom in: its process died.
_IN_FLIGHT_STATES = (states.RUNNING, states.REVERTING)
#: Task states after which where the task ran is recorded in its metadata.
_PLACED_STATES = frozenset(
    (states.SUCCESS, states.FAILURE, states.REVERTED, states.REVERT_FAILURE))
#: Atom metadata key of every attempt's ``{"attempt", "action", "worker", "outcome"}``.
_META_ATTEMPT_LOG = "attempt_log"
#: Most attempts kept in it per atom (a retried subflow runs its atoms again and again).
_MAX_LOGGED_ATTEMPTS = 50


class WorkerBasedActionEngine(ActionEngine):
    """Runs a flow's tasks on workers reached through a broker.

    Options (as TaskFlow's, plus ``taskflow_compat``, and those every engine reads: see
    :class:`~flowengine.engines.options.EngineOptions`):
        exchange: the exchange workers listen on (default ``"default"``).
        url: broker URL (None: the embedded filesystem transport).
        topics: the worker topics tasks may run on (asked for workers; flowengine workers also
            announce themselves); no other topic is sent anything. None listed: any topic.
        transport, transport_options, retry_options: broker settings.
        transition_timeout: seconds a request may wait for a worker to take it (default 60).
        worker_expiry: seconds after which a silent worker is forgotten (default 60).
        executor: a ready-made :class:`WorkerTaskExecutor` to use instead.
        taskflow_compat: declare queues exactly as TaskFlow does (for mixed fleets).
        lease_timeout: seconds a running remote task may go without a heartbeat before it is
            re-dispatched (default 10; None disables leases).
        heartbeat_interval: seconds between worker heartbeats (default 2).
        max_attempts: attempts per task before it fails with WorkerLost (default 3).
        pickup_timeout: seconds a request may wait untaken on a flowengine worker's topic that
            sends nothing at all, before it goes to another capable worker (default 5).
        quiet_start: short tasks reply with their outcome alone, no RUNNING first (default
            None: on RabbitMQ and other AMQP brokers, off elsewhere; see doc/workers.rst).
        time_limits: ``{task name: seconds}`` overriding tasks' ``time_limit``.
        connect_timeout: seconds ``run()`` waits for the broker connection before it fails
            with BrokerUnreachable naming the broker (default 30).
        events: publish events to ``<exchange>.events`` (default True; see doc/operations.rst).
        metrics: update the Prometheus metrics (default False; the ``metrics`` extra).
        metrics_port: also serve them on ``127.0.0.1:PORT/metrics`` from when the flow runs
            (implies ``metrics``; the endpoint is the process's and outlives the run).
        clock: monotonic seconds of request expiries, leases, time limits and silent workers
            (tests inject one to move them along without sleeping).
    """

    KIND = "worker-based"
    EXTRA_OPTIONS = OPTION_NAMES

    def __init__(self, flow: flow_base.Flow | Atom, flow_detail: FlowDetail,
                 backend: Backend | None, options: Mapping[str, Any] | None) -> None:
        super().__init__(flow, flow_detail, backend, options)
        self._worker_executor: local.TaskExecutor | None = None
        #: The validated worker-based options (a mistyped one fails here).
        # TaskFlow's options it has no use for (gather_statistics...) are ignored, as TaskFlow
        # ignores them.
        self.worker_options = opts = WorkerEngineOptions.from_mapping(
            {k: v for k, v in self._options.extra.items()
             if k in OPTION_NAMES or k not in TASKFLOW_OPTIONS}
            | {"time_limits": self._options.time_limits})
        # A ready-made executor may use a broker the options do not name: publish nowhere then.
        known = self._options.executor is None or opts.url or opts.transport
        self._publisher: ext.EventSink = ext.NO_EVENTS
        if opts.events and known:
            self._publisher = EventPublisher(
                opts.exchange, url=opts.url, transport=opts.transport,
                transport_options=opts.transport_options)
        self._metrics_port = opts.metrics_port
        self._metrics: ext.EventSink = ext.NO_EVENTS
        if self._metrics_port is not None or opts.metrics:
            from flowengine.worker_based.metrics import MetricsSink

            self._metrics = MetricsSink(role="engine")
        #: ``(attempt, worker)`` of an atom uuid, for the atom log and events.
        self.atom_placement = PlacementSink()
        # What the engine records and reports of each whole run, after the hooks it was
        # given: where each task ran, then its events and metrics (when on).
        # Weakly: the hooks, the executor and their callbacks are the engine's own, and a
        # callback holding the engine would make a reference cycle (see utils.cycle_free).
        self.hooks.append(_Placement(WeakMethod(self._record_placement, None)))
        if self._publisher is not ext.NO_EVENTS:
            self.hooks.append(EventHook(self._publisher, task_events=False))
        if self._metrics is not ext.NO_EVENTS:
            self.hooks.append(EventHook(self._metrics))
        #: The endpoint option ``metrics_port`` serves (its ``server_port``), once running.
        self.metrics_server: Any = None
        #: The broker client handing this engine SUSPEND messages while it runs.
        self._suspends_from: Any = None

    @property
    def worker_executor(self) -> local.TaskExecutor:
        """The executor that sends this engine's tasks to workers (made on first use)."""
        return self._task_executor()

    def run_iter(self, timeout: float | None = None) -> Iterator[str]:
        if self._metrics_port is not None:
            self._serve_metrics(self._metrics_port)
        try:
            return (yield from super().run_iter(timeout=timeout))
        finally:
            if self._suspends_from is not None:
                self._suspends_from.take_suspends(self.storage.flow_uuid, None)
                self._suspends_from = None

    def _set_up(self) -> None:
        self._revoke_stale_attempts()
        super()._set_up()

    def _reach(self) -> dict[str, Any]:
        # SUSPEND messages to this process's reply queue reach this engine while it runs.
        executor = self._worker_executor
        if not isinstance(executor, WorkerTaskExecutor):
            return {}
        client = self._suspends_from = executor.client
        client.take_suspends(self.storage.flow_uuid, self._pushed)
        return {"broker": rc.reach(client.broker, client.reply_to)}

    def _pushed(self, action: str) -> None:
        """A SUSPEND message for this flow came through the broker (its action: suspend, or
        read the stored cancel request now)."""
        if action == rc.ACTION_CANCEL:
            self._read_marks_now()
        else:
            self.suspend()

    def _revoke_stale_attempts(self) -> None:
        """Have workers drop the requests a dead predecessor left queued.

        An atom stored RUNNING or REVERTING as a run starts was in flight when the process
        that ran the flow died (a suspended run waits for its atoms). Its request may still
        wait in a worker queue: this run sends the atom again, so the old one must not run
        too. Its id was stored with the state; the executor revokes such ids as it starts, and
        deletes the delayed jobs (beanstalkd) whose handles were stored after they were put.
        """
        self.prepare()
        executor = self._task_executor()
        storage, stale, jobs = self.storage, [], []
        for atom in self.compilation.iter_atoms():
            if storage.get_atom_state(atom.name) not in _IN_FLIGHT_STATES:
                continue
            detail = storage.flow_detail.find(storage.get_atom_uuid(atom.name))
            meta = detail.meta if detail is not None else {}
            stale += [i for i in meta.get(META_ATTEMPT_IDS) or () if isinstance(i, str)]
            if isinstance(meta.get(META_DELAYED_JOB), str):
                jobs.append(meta[META_DELAYED_JOB])  # a delayed request, still in the broker
        if jobs:
            executor.delete_at_start(jobs)
        if stale:
            LOG.info("Flow %r resumes with %d request(s) its previous run left in flight; "
                     "asking workers not to run them", storage.flow_name, len(stale))
            executor.revoke_at_start(stale)

    def _remember_attempt(self, atom_uuid: str, request_id: str) -> None:
        """Store the id of an attempt sent again (a lost worker, a hand-back) with its atom,
        before it is published, so a resumed engine can revoke it as well.

        If the engine can no longer record its progress (it was halted: a conductor's claim
        lapsed, the store is gone; or this very write is refused), the attempt is not sent:
        its atom fails with the storage failure, which the halting engine writes nowhere.
        Sent, it would be work no record holds, perhaps of an atom another conductor has
        completed meanwhile.
        """
        refused = self.storage.unsaved
        if refused is None:
            try:
                detail = self.storage.flow_detail.find(atom_uuid)
                if detail is None:
                    return
                ids = [i for i in detail.meta.get(META_ATTEMPT_IDS) or () if isinstance(i, str)]
                self.storage.update_atom_metadata(
                    detail.name, {META_ATTEMPT_IDS: (ids + [request_id])[-_MAX_ATTEMPT_IDS:]})
                return
            except StorageFailure as err:
                refused = err
            except Exception:  # a bookkeeping write must not break the run
                LOG.warning("Could not store request %s of atom %s", request_id, atom_uuid,
                            exc_info=True)
                return
        LOG.warning("Not sending request %s of atom %s again: the flow's progress can no "
                    "longer be recorded (%s)", request_id, atom_uuid, refused)
        executor = self._worker_executor
        if isinstance(executor, WorkerTaskExecutor):
            executor.refuse(request_id, refused)

    def _serve_metrics(self, port: int) -> None:
        from flowengine.worker_based.metrics import start_metrics_server

        try:
            self.metrics_server = start_metrics_server(port)
        except OSError as err:  # metrics are for watching the flow: not a reason to fail it
            LOG.warning("Flow %r runs without its metrics endpoint: cannot serve metrics on "
                        "127.0.0.1:%d: %s", self.storage.flow_name, port, err)

    def _record_placement(self, state: str, details: dict[str, Any]) -> None:
        """Store every attempt of a remote task: number, action, worker and outcome
        (``flowengine show`` lists them); ``worker`` and ``attempts`` keep the last execute's."""
        name, uuid = details.get("task_name"), details.get("task_uuid")
        if state not in _PLACED_STATES or not name or not uuid:
            return
        tried = self.atom_placement.settle(uuid, state)
        if not tried:
            return
        try:
            detail = self.storage.flow_detail.find(uuid)
            logged = list(detail.meta.get(_META_ATTEMPT_LOG) or []) if detail else []
            update: dict[str, Any] = {
                _META_ATTEMPT_LOG: (logged + tried)[-_MAX_LOGGED_ATTEMPTS:]}
            executed = [a for a in tried if a["action"] == pr.EXECUTE]
            if executed and executed[-1]["worker"] is not None:
                update.update(worker=executed[-1]["worker"], attempts=executed[-1]["attempt"])
            self.storage.update_atom_metadata(name, update)
        except Exception:  # a bookkeeping write must not break the run
            LOG.warning("Could not record where task %r ran", name, exc_info=True)

    def _task_executor(self) -> local.TaskExecutor:
        if self._worker_executor is not None:
            return self._worker_executor
        given = self._options.executor
        if given is not None:
            if not isinstance(given, local.TaskExecutor):
                raise TypeError(
                    f"Worker-based engine option 'executor' must be a "
                    f"WorkerTaskExecutor, not {given!r}"
                )
            executor = given
        else:
            executor = WorkerTaskExecutor.from_options(
                self.storage.flow_uuid, self.worker_options,
                events=combine(self._publisher, self._metrics, self.atom_placement,
                               _AttemptIds(WeakMethod(self._remember_attempt, None))),
                secret_args=WeakMethod(self._secret_args, []))
        if isinstance(executor, WorkerTaskExecutor):
            executor.hooks = self.hooks  # its requests are this engine's while it runs them
        self._worker_executor = executor
        return executor

    def _secret_args(self, task: Atom) -> list[str]:
        """The names of ``task``'s arguments whose values are secret: its own ``secret_args``
        and those it reads from a secret stored name (requests name them in a header)."""
        injected = {name for name, value in (task.inject or {}).items()
                    if isinstance(value, Secret)}
        names = set(sa.task_secret_args(task))
        names.update(arg for arg, stored in task.rebind.items()
                     if stored in injected or self.storage.is_secret_name(stored))
        return sorted(names)


class _Placement(hk.Hook):
    """Records where each task ran (its worker and attempt) in its metadata, as its state
    changes, for the whole of each run."""

    def __init__(self, record: Callable[[str, dict[str, Any]], None]) -> None:
        self._record = record

    def whole_run(self, engine: ActionEngine) -> contextlib.AbstractContextManager[object]:
        # One registration for every atom state, filtered by the recorder: an engine per
        # flow registers it per run, and each registration costs more than the filter.
        return register_deregister(engine.atom_notifier, Notifier.ANY, self._record)


class _AttemptIds(ext.EventSink):
    """Hands the ids of an atom's later attempts to ``remember`` as they are sent (the
    first one's was stored with the atom's RUNNING or REVERTING state)."""

    def __init__(self, remember: Callable[[str, str], None]) -> None:
        self._remember = remember

    def emit(self, event_type: str, **fields: object) -> None:
        attempt, request_id, atom_uuid = (fields.get("attempt"), fields.get("request_id"),
                                          fields.get("atom_uuid"))
        if (event_type == "task-sent" and isinstance(attempt, int) and attempt > 1
                and isinstance(request_id, str) and isinstance(atom_uuid, str)):
            self._remember(atom_uuid, request_id)
