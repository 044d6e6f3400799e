"""WorkerTaskExecutor: runs an engine's tasks on remote workers and hands back futures.

Each attempt is a :class:`~flowengine.worker_based.protocol.Request` with its own id, used as
the message's ``correlation_id`` (TaskFlow workers echo it as they echo anything), so a late reply
from an earlier attempt can never complete a later one. Requests wait in WAITING until a capable
worker is known and are published the moment one appears; replies are consumed as they arrive on
the executor's own queue, ``<exchange>_<engine uuid>``.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines import executor as local
from flowengine.task import EVENT_UPDATE_PROGRESS
from flowengine.types.failure import Failure
from flowengine.worker_based import dispatcher as dp
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import proxy as px
from flowengine.worker_based.types import TopicWorker, WorkerFinder, header

LOG = logging.getLogger(__name__)

#: Seconds between NOTIFY rounds to the configured topics (how TaskFlow workers stay known).
NOTIFY_PERIOD = pr.NOTIFY_PERIOD


class WorkerTaskExecutor(local.TaskExecutor):
    """Executes tasks on workers reached through a broker.

    Args:
        uuid: this executor's id; its reply queue is ``<exchange>_<uuid>``.
        exchange: the exchange workers listen on.
        topics: worker topics to ask for workers (flowengine workers also announce themselves).
        transition_timeout: seconds a request may stay WAITING/PENDING before it fails with
            RequestTimeout (None: forever).
        url, transport, transport_options, retry_options, taskflow_compat: broker settings, see
            :class:`~flowengine.worker_based.proxy.Proxy`.
        worker_expiry: seconds after which a silent worker is forgotten.
        clock: monotonic clock (tests inject one to move time without sleeping).
        notify_period: seconds between NOTIFY rounds to ``topics``.
    """

    def __init__(
        self,
        uuid: str,
        exchange: str,
        topics: Iterable[str],
        transition_timeout: float | None = pr.REQUEST_TIMEOUT,
        url: str | None = None,
        transport: Any = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | None = None,
        worker_expiry: float | None = pr.EXPIRES_AFTER,
        taskflow_compat: bool = False,
        clock: Callable[[], float] = time.monotonic,
        notify_period: float = NOTIFY_PERIOD,
    ) -> None:
        self._uuid = uuid
        self._topics = list(topics)
        self._transition_timeout = transition_timeout
        self._clock = clock
        self._notify_period = notify_period
        self._next_notify = 0.0
        self._lock = threading.RLock()
        self._ongoing: dict[str, pr.Request] = {}
        self._workers_of: dict[str, TopicWorker] = {}
        self.finder = WorkerFinder(worker_expiry, clock=clock, on_change=self._dispatch_waiting)
        handlers = {
            pr.RESPONSE: dp.Handler(self._on_response, pr.Response.validate),
            pr.NOTIFY: dp.Handler(
                self._on_notify, functools.partial(pr.Notify.validate, response=True)
            ),
        }
        self._proxy = px.Proxy(
            uuid,
            exchange,
            handlers,
            on_wait=self.on_wait,
            url=url,
            transport=transport,
            transport_options=transport_options,
            retry_options=retry_options,
            taskflow_compat=taskflow_compat,
            extra_routing_keys=[pr.DISCOVERY_ROUTING_KEY],
            on_connected=self._notify_topics,
        )
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start consuming replies (in a background thread) and ask the topics for workers."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._proxy.start, daemon=True, name=f"flowengine-executor-{self._uuid[:8]}"
            )
            self._thread.start()
        if not self._proxy.wait(timeout=30):
            raise exc.ExecutionFailure(
                f"Executor {self._uuid} could not start consuming from "
                f"{self._proxy.connection_details.uri}"
            )

    def stop(self) -> None:
        """Stop consuming; requests still outstanding fail with RequestTimeout."""
        self._proxy.stop()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)
        with self._lock:
            leftovers = list(self._ongoing.values())
        for request in leftovers:
            self._fail(
                request,
                exc.RequestTimeout(
                    f"Request {request.request_id} for task {request.task.name!r} was still "
                    f"{request.current_state} when its executor stopped"
                ),
            )

    def wait_for_workers(self, workers: int = 1, timeout: float | None = None) -> int:
        """Block until ``workers`` workers are known; return how many are still missing."""
        return self.finder.wait_for_workers(workers, timeout)

    # -- submitting -------------------------------------------------------------------------

    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Mapping[str, Any],
        progress_callback: local.ProgressCallback | None = None,
    ) -> cf.Future:
        request = pr.Request(
            task,
            task_uuid,
            pr.EXECUTE,
            arguments,
            timeout=self._transition_timeout,
            clock=self._clock,
        )
        return self._submit(request, progress_callback)

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure],
        progress_callback: local.ProgressCallback | None = None,
    ) -> cf.Future:
        request = pr.Request(
            task,
            task_uuid,
            pr.REVERT,
            arguments,
            timeout=self._transition_timeout,
            result=result,
            failures=failures,
            clock=self._clock,
        )
        return self._submit(request, progress_callback)

    def _submit(
        self, request: pr.Request, progress_callback: local.ProgressCallback | None
    ) -> cf.Future:
        if progress_callback is not None:
            # Progress EVENTs are re-emitted on the local task's notifier, as TaskFlow does.
            notifier = request.task.notifier
            notifier.register(EVENT_UPDATE_PROGRESS, progress_callback)
            request.future.add_done_callback(
                lambda _f: notifier.deregister(EVENT_UPDATE_PROGRESS, progress_callback)
            )
        with self._lock:
            self._ongoing[request.request_id] = request
        self._dispatch(request)
        return request.future

    def _dispatch(self, request: pr.Request) -> None:
        """Publish a WAITING request to the best capable worker, if one is known."""
        worker = self.finder.get_worker_for_task(pr.task_class_name(request.task))
        if worker is None:
            LOG.debug(
                "No worker yet for %r; request %s waits", request.task.name, request.request_id
            )
            return
        with self._lock:
            if request.current_state != pr.WAITING or request.request_id not in self._ongoing:
                return
            request.transition(pr.PENDING)
            worker.in_flight += 1
            self._workers_of[request.request_id] = worker
        try:
            self._proxy.publish(
                request,
                worker.topic,
                reply_to=self._uuid,
                correlation_id=request.request_id,
                headers=self._headers(request),
            )
        except Exception as err:
            LOG.warning(
                "Publishing request %s for %r to topic %r failed: %s",
                request.request_id,
                request.task.name,
                worker.topic,
                err,
            )
            self._finish(request, Failure())

    def _headers(self, request: pr.Request) -> dict[str, Any]:
        headers: dict[str, Any] = {
            pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION,
            pr.HEADER_REQUEST_ID: request.request_id,
            pr.HEADER_ATTEMPT: request.attempt,
            pr.HEADER_ATOM_UUID: request.uuid,
            pr.HEADER_TASK_NAME: request.task.name,
            pr.HEADER_ORIGIN: pr.origin(),
        }
        limit = getattr(request.task, "time_limit", None)
        if limit:
            headers[pr.HEADER_TIME_LIMIT] = float(limit)
        return headers

    def _dispatch_waiting(self) -> None:
        with self._lock:
            waiting = [r for r in self._ongoing.values() if r.current_state == pr.WAITING]
        for request in waiting:
            self._dispatch(request)

    # -- completing -------------------------------------------------------------------------

    def _finish(self, request: pr.Request, result: Any) -> None:
        """Complete a request's future exactly once."""
        with self._lock:
            if self._ongoing.pop(request.request_id, None) is None:
                return
            worker = self._workers_of.pop(request.request_id, None)
            if worker is not None:
                worker.in_flight = max(worker.in_flight - 1, 0)
        if request.current_state not in (pr.SUCCESS, pr.FAILURE):
            request.transition_and_log_error(pr.FAILURE, logger=LOG)
        request.set_result(result)

    def _fail(self, request: pr.Request, error: Exception) -> None:
        self._finish(request, Failure.from_exception(error))

    def _on_response(self, data: Any, message: Any) -> None:
        correlation_id = message.properties.get("correlation_id")
        headers = message.headers
        self.finder.seen(header(headers, pr.HEADER_WORKER), header(headers, pr.HEADER_CAPACITY))
        with self._lock:
            request = self._ongoing.get(correlation_id)
        if request is None:
            # A reply to an attempt that already finished (late, duplicate or from a lapsed
            # attempt): applying it would complete an atom twice.
            LOG.info(
                "Ignoring %s reply for unknown or finished request %s",
                data.get("state"),
                correlation_id,
            )
            return
        response = pr.Response.from_dict(data)
        state = response.state
        if state == pr.EVENT:
            request.task.notifier.notify(response.data["event_type"], response.data["details"])
        elif state == pr.RUNNING:
            request.transition_and_log_error(pr.RUNNING, logger=LOG)
        elif state in (pr.SUCCESS, pr.FAILURE):
            if request.current_state == pr.PENDING:
                # The RUNNING reply was lost or overtaken; the outcome still counts.
                request.transition_and_log_error(pr.RUNNING, logger=LOG)
            if request.transition_and_log_error(state, logger=LOG):
                self._finish(request, response.data["result"])
        else:
            LOG.warning("Ignoring reply in state %s for request %s", state, correlation_id)

    def _on_notify(self, data: Any, message: Any) -> None:
        headers = message.headers or {}
        identity = header(headers, pr.HEADER_WORKER)
        if header(headers, pr.HEADER_WORKER_STATUS) == pr.WORKER_OFFLINE:
            if identity:
                self.finder.remove(identity)
            return
        self.finder.add(
            data["topic"],
            data["tasks"],
            identity=identity,
            capacity=header(headers, pr.HEADER_CAPACITY),
            flowengine=header(headers, pr.HEADER_PROTOCOL) is not None,
        )

    # -- housekeeping (consumer thread) -----------------------------------------------------

    def _notify_topics(self) -> None:
        self._next_notify = self._clock() + self._notify_period
        for topic in self._topics:
            try:
                self._proxy.publish(
                    pr.Notify(),
                    topic,
                    reply_to=self._uuid,
                    headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                )
            except Exception as err:
                LOG.warning("Could not ask topic %r for workers: %s", topic, err)

    def on_wait(self) -> None:
        """Expire overdue requests, forget silent workers, re-ask topics (runs periodically)."""
        now = self._clock()
        if self._topics and now >= self._next_notify:
            self._notify_topics()
        self.finder.expire()
        with self._lock:
            expired = [r for r in self._ongoing.values() if r.expired]
        for request in expired:
            self._fail(
                request,
                exc.RequestTimeout(
                    f"Request {request.request_id} for task {request.task.name!r} has expired "
                    f"after waiting for {request.timeout} seconds for it to transition out of "
                    f"(WAITING, PENDING) states"
                ),
            )
