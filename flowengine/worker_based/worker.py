"""A worker: runs the task classes it was started with, for any engine on its exchange and topic.

On start (and after every reconnect) a worker announces itself: it publishes its NOTIFY reply body
``{"topic", "tasks"}`` with routing key ``protocol.DISCOVERY_ROUTING_KEY`` and headers naming its
id, free capacity and status (``online``; ``offline`` when it stops).
flowengine engines bind their reply queue with that key and learn of workers without polling;
TaskFlow engines never bind it, keep polling with NOTIFY, and are answered as before.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import importlib
import inspect
import logging
import os
import platform
import sys
import threading
import types
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from typing import Any

from flowengine import hooks as hk
from flowengine import task as task_mod
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import endpoint as ep
from flowengine.worker_based import events as ev
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import server as sv
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker.connection import TransportSpec
from flowengine.worker_based.worker_side import async_runner as ar
from flowengine.worker_based.worker_side.autoscale import AutoscalePool, Autoscaler
from flowengine.worker_based.worker_side.limits import CoordinationSpec, WorkerLimits

LOG = logging.getLogger(__name__)

#: Seconds in-flight requests get, on stop, to publish their outcome before being redelivered.
DEFAULT_STOP_GRACE = 30.0
#: Seconds between worker-heartbeat events.
DEFAULT_EVENT_HEARTBEAT = 2.0
#: Name prefix of the task threads of a worker's own executor.
TASK_THREAD_PREFIX = "flowengine-task"

TaskSpec = str | types.ModuleType | type[task_mod.Task]
#: What :meth:`Worker.run` raises when the broker refuses the credentials (not retried).
BrokerRefused = bo.BrokerRefused
_OWN_PACKAGE = __name__.partition(".")[0]


@dataclasses.dataclass(frozen=True)
class WorkerStats:
    """What a worker is doing, read at one moment (:meth:`Worker.stats`); the same figures
    go out in its ``worker-heartbeat`` events.

    Attributes:
        worker_id: The worker's identity (``host:pid:random``).
        topic: The topic it serves.
        capacity: Requests it holds at once: task threads (their most) plus async slots (None:
            an executor of unknown size).
        threads: Task threads now (they vary with ``autoscale``).
        async_slots: ``async def`` calls it may await at once.
        free_slots: Slots not running a request (None: capacity unknown).
        in_flight: Requests taken and not settled yet.
        prefetch: The broker prefetch limit now (None: none): below the capacity after a
            reconnect while requests taken before it still run, above the threads while async
            calls are awaited.
        paused: Whether the topic is paused here.
        paused_for: Seconds left of a timed pause (None: not paused, or until resumed).
        revoked: Request ids it was asked not to run whose request has not reached it yet.
    """

    worker_id: str
    topic: str
    capacity: int | None
    threads: int | None
    async_slots: int
    free_slots: int | None
    in_flight: int
    prefetch: int | None
    paused: bool
    paused_for: float | None
    revoked: int


def _is_task_class(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, task_mod.Task) and not inspect.isabstract(obj)


def _is_served_from_module(obj: Any) -> bool:
    # flowengine's own classes (FunctorTask...) are bases and helpers a task module imports,
    # never tasks it offers.
    own = getattr(obj, "__module__", "").partition(".")[0] == _OWN_PACKAGE
    return _is_task_class(obj) and not own


def _spec_list(tasks: TaskSpec | Iterable[TaskSpec]) -> list[TaskSpec]:
    # One spec may be given bare, not in a list.
    return [tasks] if isinstance(tasks, (str, types.ModuleType, type)) else list(tasks)


def find_task_classes(tasks: TaskSpec | Iterable[TaskSpec]) -> list[type[task_mod.Task]]:
    """Resolve task specs to Task subclasses, sorted by wire name.

    Args:
        tasks: Each ``'pkg.mod'`` or a module object (every public concrete Task subclass the
            module defines or imports, as TaskFlow's ``find_subclasses`` finds them, except
            flowengine's own classes), ``'pkg.mod:Class'`` (also ``'pkg.mod:Outer.Inner'``)
            or a class.

    Raises:
        ImportError: A named module or class does not exist.
        TypeError: An item is not a Task subclass, module or string.
    """
    specs = _spec_list(tasks)
    found: dict[str, type[task_mod.Task]] = {}
    for item in specs:
        module = None
        if isinstance(item, str):
            module_name, _, attr_path = item.partition(":")
            module = importlib.import_module(module_name)
            if attr_path:
                obj: Any = module
                for attr in attr_path.split("."):
                    obj = getattr(obj, attr, None)
                if obj is None:
                    raise ImportError(f"Task class '{item}' not found")
                if not _is_task_class(obj):
                    raise TypeError(f"'{item}' is not a concrete Task subclass: {obj!r}")
                found[pr.task_class_name(obj)] = obj
                module = None
        elif isinstance(item, types.ModuleType):
            module = item
        elif _is_task_class(item):
            found[pr.task_class_name(item)] = item
        else:
            raise TypeError(f"Expected a module, 'pkg.mod[:Class]' or Task subclass, got {item!r}")
        if module is not None:
            for name, obj in vars(module).items():
                if not name.startswith("_") and _is_served_from_module(obj):
                    found[pr.task_class_name(obj)] = obj
    return [found[name] for name in sorted(found)]


def _refuse_process_pool(executor: Executor | None, topic: str) -> None:
    """Refuse a process pool as a worker's executor, in one line saying what to use instead.

    A worker serves a request on the executor whole: it replies, sends heartbeats and
    acknowledges the request over the process's broker connections, which cannot be handed to
    another process (a process pool would fail to pickle the call, unseen, and the worker would
    take requests and never run them). Serving tasks in child processes properly (JSON
    arguments and results through a pipe, a time limit that kills the child and frees its
    slot, a task limit per child) is not built: run more worker processes instead.

    Raises:
        ValueError: ``executor`` is a :class:`concurrent.futures.ProcessPoolExecutor`.
    """
    if isinstance(executor, cf.ProcessPoolExecutor):
        raise ValueError(
            f"Worker on topic '{topic}': executor={type(executor).__name__} is not supported "
            f"(requests are served on threads of the worker's own process); give "
            f"threads_count=N, or start more worker processes (flowengine worker --threads N)")


class Worker:
    """Serves remote task requests on ``<exchange>_<topic>``.

    Args:
        exchange: The exchange engines publish requests to.
        topic: This worker's topic; workers sharing a topic share its queue.
        tasks: Task specs, see :func:`find_task_classes`.
        executor: Runs tasks, on threads of this process; by default a thread pool of
            ``threads_count`` threads. A process pool is refused: requests are answered
            over this process's broker connections.
        threads_count: Task threads (default: 5 per CPU); also the prefetch limit.
        url: Broker URL (default: the embedded filesystem transport).
        transport: Kombu transport name or class.
        transport_options: Kombu transport options.
        retry_options: See :class:`~flowengine.worker_based.backoff.RetryOptions`.
        taskflow_compat: Use TaskFlow's exact declarations, for fleets mixing TaskFlow peers.
        events: Publish events to ``<exchange>.events`` (True, the default), not at all (False),
            or to the given :class:`~flowengine.worker_based.extensions.EventSink`.
        metrics: Update the Prometheus metrics (the ``metrics`` extra).
        heartbeat_interval: Seconds between worker-heartbeat events.
        autoscale: ``(MAX, MIN)``: task threads grow with the backlog up to MAX and shrink to
            MIN when idle, and the broker prefetch follows (see
            :mod:`~flowengine.worker_based.worker_side.autoscale`); not with ``executor`` or
            ``threads_count``. Engines are told MAX as the capacity.
        signing_key, signing_key_file: The key engines and workers share to sign messages
            (default: ``FLOWENGINE_SIGNING_KEY``), see :mod:`~flowengine.worker_based.signing`.
        async_concurrency: Most ``async def`` execute/revert calls awaited at once on the
            worker's event loop thread (default 1000; see
            :mod:`~flowengine.worker_based.worker_side.async_runner`). A worker serving such
            tasks announces its threads plus these slots as its capacity; its broker prefetch
            adds the slots to the threads while async calls are awaited.
        limits: ``{key: N}``: at most N requests under each key run at once across every
            worker and engine using ``coordination`` (a key is a task class's short or full
            name, or ``topic`` for this worker's topic); see
            :mod:`~flowengine.worker_based.worker_side.limits`.
        coordination: Where the limits are held: a jobboard URI or conf (Redis, ZooKeeper,
            etcd) or a :class:`~flowengine.coordination.Coordinator`.
        hooks: The hooks called around each request served and at each reply (see
            :mod:`flowengine.hooks`; tracing is one); by default the process's
            :data:`flowengine.hooks.defaults` as they are when the worker is made.

    Raises:
        ValueError: ``tasks`` resolve to no task class at all; a bad ``autoscale``; a bad
            signing key; ``async_concurrency`` below 1; a process pool as ``executor``.
        ImportError, TypeError: See :func:`find_task_classes`.
    """

    def __init__(
        self,
        exchange: str,
        topic: str,
        tasks: TaskSpec | Iterable[TaskSpec],
        executor: Executor | None = None,
        threads_count: int | None = None,
        url: str | None = None,
        transport: TransportSpec | None = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | None = None,
        taskflow_compat: bool = False,
        events: bool | ext.EventSink = True,
        metrics: bool = False,
        heartbeat_interval: float = DEFAULT_EVENT_HEARTBEAT,
        autoscale: tuple[int, int] | None = None,
        signing_key: str | None = None,
        signing_key_file: str | None = None,
        async_concurrency: int | None = None,
        limits: Mapping[str, int] | None = None,
        coordination: CoordinationSpec | None = None,
        hooks: Iterable[hk.Hook] | None = None,
    ) -> None:
        _refuse_process_pool(executor, topic)
        signing = sg.Signing.from_options(signing_key, signing_key_file)
        worker_limits = WorkerLimits(limits, topic, coordination)
        self._exchange, self._topic = exchange, topic
        specs = _spec_list(tasks)
        classes = find_task_classes(specs)
        if not classes:
            named = [getattr(spec, "__name__", str(spec)) for spec in specs]
            raise ValueError(f"Worker on topic '{topic}': the task specs {named} hold no "
                             f"concrete Task subclasses, so it would serve nothing")
        self._owns_executor = executor is None
        self._pool: AutoscalePool | None = None
        if autoscale is not None:
            if executor is not None or threads_count is not None:
                raise ValueError(f"Worker on topic '{topic}': autoscale sizes its own pool; "
                                 f"give neither executor nor threads_count with it")
            self._pool = executor = AutoscalePool(Autoscaler(*autoscale),
                                                  thread_name_prefix=TASK_THREAD_PREFIX)
            threads_count = autoscale[0]
        if executor is None:
            threads_count = threads_count or (os.cpu_count() or 1) * 5
            # The standard pool: its threads exit at once on shutdown, where futurist's idle
            # threads keep a stopping worker process alive for another second.
            executor = cf.ThreadPoolExecutor(max_workers=threads_count,
                                             thread_name_prefix=TASK_THREAD_PREFIX)
        self._executor = executor
        self._threads_count = threads_count
        self._endpoints = [ep.Endpoint(cls) for cls in classes]
        self._runner = ar.AsyncRunner(ar.validate_concurrency(async_concurrency, topic))
        # Slots only count where something can take them: a thread-only worker announces what
        # it announced before.
        self._async_slots = self._runner.concurrency if ar.serves_async(self._endpoints) else 0
        self._run_thread: int | None = None
        if events is True:
            events = ev.EventPublisher(exchange, url=url, transport=transport,
                                       transport_options=transport_options)
        elif events is False:
            events = ext.NO_EVENTS
        if metrics:
            from flowengine.worker_based.metrics import MetricsSink

            events = ev.combine(events, MetricsSink(role="worker"))
        self._events, self._heartbeat_interval = events, heartbeat_interval
        self._server = sv.Server(
            topic, exchange, executor, self._endpoints, url=url, transport=transport,
            transport_options=transport_options, retry_options=retry_options,
            taskflow_compat=taskflow_compat, capacity=self.capacity, events=events,
            prefetch=self._prefetch if self._pool is not None or self._async_slots else None,
            signing=signing, async_runner=self._runner, limits=worker_limits,
            hooks=hk.Hooks(hk.defaults if hooks is None else hooks),
        )  # fmt: skip
        self._ticker = None if events is ext.NO_EVENTS else ev.Ticker(
            events, "worker-heartbeat", heartbeat_interval, self._heartbeat)

    @property
    def hooks(self) -> hk.Hooks:
        """The hooks called around each request this worker serves and at each of its
        replies (see :mod:`flowengine.hooks`)."""
        return self._server.hooks

    def stats(self) -> WorkerStats:
        """What the worker is doing now (see :class:`WorkerStats`)."""
        server = self._server
        return WorkerStats(
            worker_id=self.worker_id, topic=self._topic, capacity=self.capacity,
            threads=self.threads, async_slots=self._async_slots, free_slots=server.free_slots,
            in_flight=server.in_flight, prefetch=server.prefetch,
            paused=server.topic_pause.paused, paused_for=server.topic_pause.remaining,
            revoked=server.revoked_waiting)

    def _heartbeat(self) -> dict[str, Any]:
        now = self.stats()
        return {"worker": now.worker_id, "topic": now.topic,
                "tasks": self._server.task_names, "versions": self._server.task_versions,
                "capacity": now.capacity, "async_slots": now.async_slots,
                "free": now.free_slots, "in_flight": now.in_flight,
                "freq": self._heartbeat_interval, "paused": now.paused,
                "paused_for": now.paused_for, "threads": now.threads,
                "prefetch": now.prefetch}

    @property
    def _threads_label(self) -> str:
        if self._pool is not None:
            scaler = self._pool.scaler
            return f"autoscale {scaler.max_threads},{scaler.min_threads}"
        return str(self._threads_count or "?")

    def _prefetch(self) -> int | None:
        """The broker prefetch now: the threads (an autoscaled pool's own figure), plus the
        async slots while async calls are awaited. The slots open with the first async request
        (taken within the threads' share) and close when none is left, so sync requests never
        pile up on a worker beyond its threads while another worker of the topic idles."""
        threads = self._threads_count if self._pool is None else self._pool.prefetch
        if threads is None:
            return None
        return threads + (self._async_slots if self._runner.running else 0)

    @property
    def capacity(self) -> int | None:
        """Requests held at once: task threads (their most, autoscaled) plus async slots
        (None: an executor of unknown size)."""
        if self._threads_count is None:
            return None
        return self._threads_count + self._async_slots

    @property
    def threads(self) -> int | None:
        """Task threads now (they vary with ``autoscale``; None: an executor of unknown size)."""
        return self._threads_count if self._pool is None else self._pool.size

    @property
    def paused(self) -> bool:
        """Whether the worker's topic is paused here (see :meth:`pause`)."""
        return self._server.topic_pause.paused

    def pause(self, seconds: float | None = None) -> None:
        """Take no new request (for ``seconds``; None: until :meth:`resume`); the ones
        running finish. ``flowengine topics pause`` does this for every worker of a topic."""
        self._server.topic_pause.set(True, seconds)

    def resume(self) -> None:
        """Take requests again after :meth:`pause`."""
        self._server.topic_pause.set(False)

    @property
    def worker_id(self) -> str:
        """This worker's identity (``host:pid:random``)."""
        return self._server.worker_id

    @property
    def endpoints(self) -> list[ep.Endpoint]:
        """The endpoints this worker serves."""
        return list(self._endpoints)

    @functools.cached_property
    def banner(self) -> str:
        """What the worker is, where it connects (password masked) and what it runs."""
        details = self._server.connection_details
        driver = details.driver_name + (
            f" v{details.driver_version}" if details.driver_version else ""
        )
        lines = [
            f"flowengine worker {self.worker_id}",
            f"  exchange: {self._exchange}  topic: {self._topic}",
            f"  transport: {details.transport} ({driver})  uri: {details.uri}",
            f"  executor: {type(self._executor).__name__}  threads: {self._threads_label}"
            + (f"  async slots: {self._async_slots}" if self._async_slots else ""),
            f"  host: {platform.node()}  pid: {os.getpid()}  python: {sys.version.split()[0]}",
            f"  tasks ({len(self._endpoints)}):",
            *(f"    - {endpoint}" for endpoint in self._endpoints),
        ]
        return "\n".join(lines)

    def run(
        self, display_banner: bool = True, banner_writer: Callable[[str], Any] | None = None
    ) -> None:
        """Serve until :meth:`stop` is called (blocks the calling thread).

        Args:
            display_banner: Show :attr:`banner` first.
            banner_writer: Gets the banner text; by default each line is logged at INFO.

        Raises:
            BrokerRefused: The broker refused the credentials; nothing was served.
        """
        if display_banner:
            if banner_writer is None:
                for line in self.banner.splitlines():
                    LOG.info(line)
            else:
                banner_writer(self.banner)
        self._run_thread = threading.get_ident()
        try:
            if self._ticker is not None:
                self._ticker.start()
            self._server.start()
        except BrokerRefused as err:
            what = ("cannot reach the broker" if bo.unknown_host(err)
                    else "was refused by the broker")
            raise BrokerRefused(f"The worker on topic '{self._topic}' {what}: {err}") from err
        finally:
            if self._ticker is not None:
                self._ticker.stop()
            self._events.close()  # flushes the worker-offline event

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the worker is serving; False on timeout."""
        return self._server.wait(timeout)

    def stop(self, grace: float = DEFAULT_STOP_GRACE) -> None:
        """Stop taking requests, let in-flight ones finish, then announce going offline.

        Args:
            grace: Seconds in-flight requests get to publish their outcome and be acknowledged
                before the channel closes; the broker redelivers whatever is left.
        """
        self._server.stop(grace)
        # The consume loop ends once in-flight requests are settled or the grace is over; from
        # run()'s own thread (a signal handler) waiting for it would deadlock.
        if threading.get_ident() != self._run_thread:
            self._server.wait_stopped(grace + 5.0)
            self._server.close()
        if self._owns_executor:
            self._executor.shutdown(wait=False)
