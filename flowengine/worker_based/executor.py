"""WorkerTaskExecutor: runs an engine's tasks on remote workers and hands back futures.

One *submission* (an atom's execute or revert) may take several *attempts*. Each attempt is a
:class:`~flowengine.worker_based.protocol.Request` with its own id, sent as the message's
``correlation_id`` (TaskFlow workers echo it as they echo anything), so a late reply from an
earlier attempt can never complete a later one. Requests wait in WAITING until a capable worker
is known and are published the moment one appears; replies are consumed as they arrive.

A RUNNING attempt on a flowengine worker holds a lease the worker's heartbeats renew. When it
lapses (worker killed, frozen or cut off) the submission is re-dispatched as a new attempt,
preferably to another worker; after ``max_attempts`` the atom fails with
:class:`~flowengine.exceptions.WorkerLost` and the request is parked as a dead letter.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines import executor as local
from flowengine.task import EVENT_UPDATE_PROGRESS
from flowengine.types.failure import Failure
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import dead_letters
from flowengine.worker_based import dispatcher as dp
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import proxy as px
from flowengine.worker_based import types as wtypes
from flowengine.worker_based.submission import RemoteFuture, Submission
from flowengine.worker_based.types import TopicWorker, WorkerFinder, header

LOG = logging.getLogger(__name__)

#: Seconds an engine's unused reply queue survives on brokers with queue expiry (AMQP).
REPLY_QUEUE_EXPIRES = 600.0
#: Heartbeat intervals a worker holding a RUNNING attempt the broker handed out again has to
#: show it is alive before the attempt is lost.
PROOF_OF_LIFE = 1.5
#: Seconds start() waits for the reply consumer to be consuming.
CONSUMER_START_TIMEOUT = 30.0
#: Seconds between scans for expired requests and lapsed leases.
HOUSEKEEPING_PERIOD = 0.1
#: Seconds between NOTIFY rounds to the configured topics (how TaskFlow workers stay known).
NOTIFY_PERIOD = pr.NOTIFY_PERIOD


# Reply queues in use by this process's executors (engines resuming one flow detail share its
# uuid, hence its queue): a closing executor deletes its queue only when no other uses it.
_queues_in_use: dict[tuple[str, str, str], int] = {}
_queues_lock = threading.Lock()


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
        lease_timeout: seconds a RUNNING request on a flowengine worker may go without a
            heartbeat before it is re-dispatched (None: never).
        heartbeat_interval: seconds between the heartbeats workers are asked to send.
        max_attempts: attempts per submission before the atom fails with WorkerLost.
        time_limits: per task name, seconds a RUNNING attempt may take (overrides the task
            class's ``time_limit``); past it the attempt fails with TaskTimeLimitExceeded.
        events: where task-sent, task-moved, task-retried and task-lost events go.
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
        lease_timeout: float | None = ext.DEFAULT_LEASE_TIMEOUT,
        heartbeat_interval: float = ext.DEFAULT_HEARTBEAT_INTERVAL,
        max_attempts: int = ext.DEFAULT_MAX_ATTEMPTS,
        time_limits: Mapping[str, float] | None = None,
        events: ext.EventSink = ext.NO_EVENTS,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if lease_timeout is not None and lease_timeout <= heartbeat_interval:
            raise ValueError(f"lease_timeout ({lease_timeout}s) must be longer than "
                             f"heartbeat_interval ({heartbeat_interval}s)")
        self._uuid = uuid
        self._exchange = exchange
        self._topics = list(topics)
        self._transition_timeout = transition_timeout
        self._clock = clock
        self._notify_period = notify_period
        self._next_notify = 0.0
        self._next_due = math.inf  # the earliest expiry, time limit or lease end in flight
        self._lease_timeout = lease_timeout
        self._heartbeat_interval = heartbeat_interval
        self._max_attempts = max_attempts
        self._time_limits = dict(time_limits or {})
        self._events = events
        self._lock = threading.RLock()
        self._ongoing: dict[str, Submission] = {}
        self._never_started: set[str] = set()
        self.finder = WorkerFinder(worker_expiry, clock=clock, on_change=self._worker_appeared)
        # Requests waiting for a worker are sent from here, not from the consumer thread that
        # learns of the worker: a burst of publishes there would hold up every reply.
        self._dispatcher = cf.ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="flowengine-dispatch")
        self._dispatch_pending = threading.Event()
        self._consumer_error: Exception | None = None
        handlers = {
            pr.RESPONSE: dp.Handler(self._on_response, pr.Response.validate),
            pr.NOTIFY: dp.Handler(self._on_notify,
                                  functools.partial(pr.Notify.validate, response=True)),
        }
        self._proxy = px.Proxy(
            uuid, exchange, handlers, on_wait=self._housekeeping, url=url, transport=transport,
            transport_options=transport_options, retry_options=retry_options,
            taskflow_compat=taskflow_compat, extra_routing_keys=[pr.DISCOVERY_ROUTING_KEY],
            on_connected=self._notify_topics,
            # An engine's reply queue outlives it only briefly (brokers that support expiry).
            queue_expires=None if taskflow_compat else REPLY_QUEUE_EXPIRES,
            # Replies are acknowledged on receipt and useless to any other engine.
            auto_ack=True,
        )
        self._thread: threading.Thread | None = None
        self._closing: threading.Thread | None = None
        self._next_housekeeping = 0.0
        self._recent_key = (self._proxy.connection_details.uri, exchange)
        self._queue_key = (self._recent_key[0], exchange, uuid)
        self._slow_close = self._proxy.connection_details.transport == "redis"
        for known in wtypes.recall(self._recent_key):
            self.finder.add(known.topic, known.tasks, identity=known.identity,
                            capacity=known.capacity, flowengine=known.flowengine)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start consuming replies (in a background thread) and ask the topics for workers."""
        closing, self._closing = self._closing, None
        if closing is not None:
            closing.join(timeout=10)
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            with _queues_lock:
                _queues_in_use[self._queue_key] = _queues_in_use.get(self._queue_key, 0) + 1
            self._consumer_error = None
            self._thread = threading.Thread(target=self._consume, daemon=True,
                                            name=f"flowengine-executor-{self._uuid[:8]}")
            self._thread.start()
            thread = self._thread
        deadline = time.monotonic() + CONSUMER_START_TIMEOUT
        # Consuming, or the consumer gave up (a refused login): whichever comes first.
        while not self._proxy.wait(timeout=0.05):
            if not thread.is_alive() or time.monotonic() > deadline:
                raise exc.ExecutionFailure(
                    f"Executor {self._uuid} could not start consuming from "
                    f"{self._proxy.connection_details.uri}: {self._consumer_error or 'timed out'}"
                ) from self._consumer_error

    def _consume(self) -> None:
        try:
            self._proxy.start()
        except Exception as err:  # kept for start() to raise; retries are the proxy's own
            LOG.error("Executor %s stopped consuming replies: %s", self._uuid, err)
            self._consumer_error = err

    def stop(self) -> None:
        """Stop consuming; submissions still outstanding fail with RequestTimeout.

        On Redis it returns at once and the consumer winds down in the background (that takes
        up to a second, the broker's blocking read); elsewhere it is quick and done in place.
        """
        self._proxy.stop()
        thread, self._thread = self._thread, None
        if thread is not None:
            with _queues_lock:
                _queues_in_use[self._queue_key] = _queues_in_use.get(self._queue_key, 1) - 1
        if self._slow_close:
            self._closing = threading.Thread(target=self._close, args=(thread,), daemon=True,
                                             name=f"flowengine-executor-close-{self._uuid[:8]}")
            self._closing.start()
        else:
            self._close(thread)
        with self._lock:
            leftovers = list(self._ongoing.values())
        for sub in leftovers:
            state = sub.request.current_state if sub.request else pr.WAITING
            self._fail(sub, exc.RequestTimeout(
                f"Request for task {sub.task.name!r} was still {state} when its executor "
                f"stopped"))

    def _close(self, consumer: threading.Thread | None) -> None:
        if consumer is not None:
            consumer.join(timeout=10)
        # Nothing reads this queue until the next start() declares it again; left in place it
        # would keep collecting worker announcements forever.
        with _queues_lock:
            if _queues_in_use.get(self._queue_key, 0) > 0:
                return
            _queues_in_use.pop(self._queue_key, None)
            self._proxy.delete_own_queue()

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
        return self._submit(Submission(task, task_uuid, pr.EXECUTE, arguments, pr.NO_RESULT,
                                       None, RemoteFuture()), progress_callback)

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure],
        progress_callback: local.ProgressCallback | None = None,
    ) -> cf.Future:
        if task_uuid in self._never_started:
            # Its execute never reached a worker (no worker, or none in time): there is nothing
            # to undo, and sending the revert would only wait for a worker in vain.
            self._never_started.discard(task_uuid)
            done: cf.Future = cf.Future()
            done.set_result((pr.ACTION_TO_EVENT[pr.REVERT], None))
            return done
        return self._submit(Submission(task, task_uuid, pr.REVERT, arguments, result, failures,
                                       RemoteFuture()), progress_callback)

    def _submit(self, sub: Submission,
                progress_callback: local.ProgressCallback | None) -> cf.Future:
        if progress_callback is not None:
            # Progress EVENTs are re-emitted on the local task's notifier, as TaskFlow does.
            notifier = sub.task.notifier
            notifier.register(EVENT_UPDATE_PROGRESS, progress_callback)
            sub.future.add_done_callback(
                lambda _f: notifier.deregister(EVENT_UPDATE_PROGRESS, progress_callback))
        sub.future.on_cancel = functools.partial(self._forget, sub)
        sub.future.on_revoke = functools.partial(self._revoke, sub)
        if sub.action == pr.EXECUTE:
            # A new run of the atom: whatever an earlier, never-started one left is moot.
            self._never_started.discard(sub.uuid)
        self._new_attempt(sub)
        return sub.future

    def _forget(self, sub: Submission) -> None:
        with self._lock:
            if sub.request is not None:
                self._ongoing.pop(sub.request.request_id, None)

    def _new_attempt(self, sub: Submission) -> None:
        request = pr.Request(
            sub.task, sub.uuid, sub.action, sub.arguments, timeout=self._transition_timeout,
            result=sub.result, failures=sub.failures, clock=self._clock,
            attempt=sub.attempts + 1)
        with self._lock:
            if sub.request is not None:
                self._ongoing.pop(sub.request.request_id, None)
            if sub.worker is not None:
                sub.worker.in_flight = max(sub.worker.in_flight - 1, 0)
            sub.attempts += 1
            sub.request, sub.worker, sub.started, sub.lease_until = request, None, None, None
            sub.suspect = None
            self._ongoing[request.request_id] = sub
        if request.timeout is not None:
            self._note_due(request.created_on + request.timeout)  # its expiry
        self._dispatch(sub)

    def _dispatch(self, sub: Submission) -> None:
        """Publish a WAITING attempt to the best capable worker, if one is known."""
        request = sub.request
        assert request is not None
        worker = self.finder.get_worker_for_task(pr.task_class_name(sub.task), avoid=sub.workers)
        if worker is None:
            LOG.debug("No worker yet for %r; request %s waits", sub.task.name, request.request_id)
            return
        with self._lock:
            if (request.current_state != pr.WAITING or sub.request is not request
                    or sub.future.done()):
                return
            request.transition(pr.PENDING)
            worker.in_flight += 1
            sub.worker, sub.topic = worker, worker.topic
            sub.workers.append(worker.identity)
            sub.future.published = True
        # Announced before publishing, so task-sent always precedes the worker's task-received.
        self._events.emit("task-sent", **self._event_fields(sub), topic=worker.topic,
                          worker=worker.identity, action=sub.action)
        try:
            # Unconfirmed: a confirm costs a broker round trip per request. A request the
            # broker loses is not lost silently: it fails after transition_timeout.
            self._proxy.publish(request, worker.topic, reply_to=self._uuid,
                                correlation_id=request.request_id,
                                headers=self._headers(sub, request),
                                priority=getattr(sub.task, "priority", 0), confirm=False)
        except Exception as err:
            LOG.warning("Publishing request %s for %r to topic %r failed: %s",
                        request.request_id, sub.task.name, worker.topic, err)
            self._finish(sub, Failure())

    def _event_fields(self, sub: Submission) -> dict[str, Any]:
        request = sub.request
        return {"flow_uuid": self._uuid, "atom_uuid": sub.uuid, "task_name": sub.task.name,
                "request_id": request.request_id if request else None, "attempt": sub.attempts}

    def _time_limit(self, task: Any) -> float | None:
        limit = self._time_limits.get(task.name, getattr(task, "time_limit", None))
        return float(limit) if limit else None

    def _headers(self, sub: Submission, request: pr.Request) -> dict[str, Any]:
        headers: dict[str, Any] = {
            pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION,
            pr.HEADER_REQUEST_ID: request.request_id,
            pr.HEADER_ATTEMPT: request.attempt,
            pr.HEADER_ATOM_UUID: request.uuid,
            pr.HEADER_TASK_NAME: sub.task.name,
            pr.HEADER_ORIGIN: pr.origin(),
        }
        if self._transition_timeout is not None:
            # Wall clock, for the worker: a request still queued after this is void, so one
            # the engine already failed never runs later as a ghost.
            headers[pr.HEADER_DEADLINE] = time.time() + self._transition_timeout
        limit = self._time_limit(sub.task)
        if limit:
            headers[pr.HEADER_TIME_LIMIT] = limit
        if self._lease_timeout is not None:
            headers[ext.HEADER_HEARTBEAT] = self._heartbeat_interval
            headers[ext.HEADER_LEASE] = self._lease_timeout
        return headers

    def _worker_appeared(self) -> None:
        if self._dispatch_pending.is_set():
            return  # a pass over the waiting requests is already queued
        self._dispatch_pending.set()
        try:
            self._dispatcher.submit(self._dispatch_waiting)
        except RuntimeError:  # shut down
            self._dispatch_pending.clear()

    def _dispatch_waiting(self) -> None:
        self._dispatch_pending.clear()
        with self._lock:
            waiting = [s for s in self._ongoing.values()
                       if s.request is not None and s.request.current_state == pr.WAITING]
        for sub in waiting:
            self._dispatch(sub)

    # -- completing -------------------------------------------------------------------------

    def _settle(self, sub: Submission) -> pr.Request | None:
        """End the current attempt's tracking; None if it had ended already."""
        with self._lock:
            request = sub.request
            if request is None or self._ongoing.pop(request.request_id, None) is None:
                return None
            if sub.worker is not None:
                sub.worker.in_flight = max(sub.worker.in_flight - 1, 0)
        if request.current_state not in (pr.SUCCESS, pr.FAILURE):
            request.transition_and_log_error(pr.FAILURE, logger=LOG)
        return request

    def _finish(self, sub: Submission, result: Any) -> None:
        """Complete a submission exactly once."""
        if self._settle(sub) is not None and not sub.future.done():
            sub.future.set_result((pr.ACTION_TO_EVENT[sub.action], result))

    def _revoke(self, sub: Submission) -> None:
        """The engine is suspending: keep the current attempt from starting if it still waits."""
        with self._lock:
            request = sub.request
            if request is None or sub.revoking == request.request_id:
                return
            state = request.current_state
            if state not in pr.WAITING_STATES:
                return  # running (or done): it is waited for
            sub.revoking = request.request_id
        if state == pr.WAITING:  # a new attempt no worker was found for: it went nowhere
            self._cancelled(sub, "it was never sent")
            return
        try:
            # Every flowengine worker hears it (TaskFlow workers do not; theirs are waited for).
            self._proxy.publish(cn.Cancel([request.request_id]), ext.DISCOVER_ROUTING_KEY,
                                headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                                declare_queue=False, confirm=False)
        except Exception as err:
            LOG.warning("Could not ask workers to drop request %s of task %r: %s; waiting for "
                        "it instead", request.request_id, sub.task.name, err)

    def _cancelled(self, sub: Submission, why: str) -> None:
        """The current attempt never ran and never will: cancel the submission."""
        request = self._settle(sub)
        if request is None:
            return
        LOG.info("Cancelled attempt %d of task %r (request %s): %s", sub.attempts,
                 sub.task.name, request.request_id, why)
        sub.future.revoked()

    def _fail(self, sub: Submission, error: Exception) -> None:
        request = sub.request
        if (sub.action == pr.EXECUTE and sub.attempts == 1 and request is not None
                and request.current_state in pr.WAITING_STATES):
            # Sent nowhere, or never picked up before its timeout: it did nothing.
            self._never_started.add(sub.uuid)
        self._finish(sub, Failure.from_exception(error))

    def _on_response(self, data: Any, message: Any) -> None:
        correlation_id = message.properties.get("correlation_id")
        headers = message.headers or {}
        self.finder.seen(header(headers, pr.HEADER_WORKER), header(headers, pr.HEADER_CAPACITY))
        with self._lock:
            sub = self._ongoing.get(correlation_id)
        if sub is None or sub.request is None:
            # A reply to an attempt that already finished or lapsed (late, duplicate, or from
            # a worker that woke up): applying it would complete an atom twice.
            # A late outcome is worth a line; a RUNNING or progress reply may trail the outcome
            # it precedes (flowengine workers send them unconfirmed), which is routine.
            level = logging.INFO if data.get("state") in (pr.SUCCESS, pr.FAILURE) else logging.DEBUG
            LOG.log(level, "Ignoring %s reply for unknown or finished request %s",
                    data.get("state"), correlation_id)
            return
        request = sub.request
        try:
            response = pr.Response.from_dict(data)
        except Exception as err:
            # Valid by schema yet undecodable: fail the attempt rather than wait on it forever.
            LOG.warning("Undecodable %s reply for request %s of task %r: %s",
                        data.get("state"), correlation_id, sub.task.name, err)
            self._fail(sub, exc.InvalidFormat(
                f"The {data.get('state')} reply for task {sub.task.name!r} (request "
                f"{correlation_id}) could not be decoded: {err}"))
            return
        state = response.state
        if state == pr.EVENT:
            event_type = response.data["event_type"]
            if event_type == ext.EVENT_HEARTBEAT:
                self._renew(sub, headers)
            elif event_type == ext.EVENT_REDELIVERED:
                self._handed_back(sub, request, header(headers, pr.HEADER_WORKER))
            elif event_type == cn.EVENT_CANCELLED:
                if request.current_state in pr.WAITING_STATES:
                    by = header(headers, pr.HEADER_WORKER) or "?"
                    self._cancelled(sub, f"worker {by} dropped it unstarted, as asked")
            else:
                sub.task.notifier.notify(response.data["event_type"], response.data["details"])
        elif state == pr.RUNNING:
            request.transition_and_log_error(pr.RUNNING, logger=LOG)
            sub.started = self._clock()
            self._holder(sub, header(headers, pr.HEADER_WORKER))
            self._renew(sub, headers)
            self._note_due(self._deadline(sub, request))  # its time limit or lease
        elif state in (pr.SUCCESS, pr.FAILURE):
            if request.current_state == pr.PENDING:
                # The RUNNING reply was lost or overtaken; the outcome still counts.
                request.transition_and_log_error(pr.RUNNING, logger=LOG)
            if request.transition_and_log_error(state, logger=LOG):
                self._finish(sub, response.data["result"])
        else:
            LOG.warning("Ignoring reply in state %s for request %s", state, correlation_id)

    def _holder(self, sub: Submission, identity: str | None) -> None:
        """Track the worker that actually took the request: workers sharing a topic share its
        queue, so it may not be the one it was sent for (and an offline notice from that one
        must not re-dispatch work another is running)."""
        if not identity or (sub.worker is not None and sub.worker.identity == identity):
            return
        # The holder may not be known yet: its announcement travels on another queue than its
        # replies and can arrive later. The attempt still moves to it, by identity.
        holder = self.finder.get(identity)
        with self._lock:
            if sub.worker is not None:
                sub.worker.in_flight = max(sub.worker.in_flight - 1, 0)
            if holder is not None:
                holder.in_flight += 1
            sub.worker = holder
            previous = sub.workers[-1] if sub.workers else None
            if sub.workers:
                sub.workers[-1] = identity
            else:
                sub.workers.append(identity)
        self._events.emit("task-moved", **self._event_fields(sub), worker=identity,
                          from_worker=previous)

    def _handed_back(self, sub: Submission, request: pr.Request, by: str | None) -> None:
        """A worker returned the current attempt unrun: the broker redelivered it to that worker,
        so whoever held it before died, was cut off, or (Redis) held it past its visibility
        timeout without settling it."""
        holder = sub.workers[-1] if sub.workers else "?"
        why = (f"the broker redelivered it to worker {by or '?'}: its worker {holder} died or "
               f"was cut off holding it")
        if request.current_state == pr.RUNNING and self._lease_timeout is not None:
            # The holder may still be running it (a long task Redis handed out again, a worker
            # whose connection blipped): one that is alive proves it with its next heartbeat,
            # which renews the lease; one that is gone lets the lease lapse soon.
            due = self._clock() + PROOF_OF_LIFE * self._heartbeat_interval
            if sub.lease_until is None or sub.lease_until > due:
                sub.lease_until = due
                self._note_due(due)  # sooner than anything noted for this attempt so far
            sub.suspect = why
            LOG.debug("Attempt %d of task %r (request %s) came back from the broker; its "
                      "lease now ends unless worker %s sends a heartbeat", sub.attempts,
                      sub.task.name, request.request_id, holder)
            return
        if request.current_state == pr.RUNNING or sub.resent >= self._max_attempts:
            self._lapse(sub, why)
            return
        # It never started (no RUNNING reply precedes the hand-back on the reply queue), so
        # sending it again costs no attempt: a graceful worker stop gives back requests it
        # prefetched. Bounded all the same, in case something kills workers before they reply.
        LOG.info("Attempt %d of task %r (request %s) never started: %s; sending it again",
                 sub.attempts, sub.task.name, request.request_id, why)
        sub.resent += 1
        self._new_attempt(sub)

    def _renew(self, sub: Submission, headers: Mapping[str, Any]) -> None:
        # Only flowengine workers send heartbeats; a TaskFlow worker's request holds no lease.
        if self._lease_timeout is not None and header(headers, pr.HEADER_PROTOCOL) is not None:
            # Later than the lease end noted before, so nothing new to note (see on_wait).
            sub.lease_until = self._clock() + self._lease_timeout
            sub.suspect = None  # alive after all

    def _on_notify(self, data: Any, message: Any) -> None:
        headers = message.headers or {}
        identity = header(headers, pr.HEADER_WORKER)
        if header(headers, pr.HEADER_WORKER_STATUS) == pr.WORKER_OFFLINE:
            if identity:
                wtypes.forget(self._recent_key, identity)
                gone = self.finder.remove(identity)
                if gone is not None:
                    self._orphaned([gone], "went offline")
            return
        worker = self.finder.add(data["topic"], data["tasks"], identity=identity,
                                 capacity=header(headers, pr.HEADER_CAPACITY),
                                 flowengine=header(headers, pr.HEADER_PROTOCOL) is not None)
        wtypes.remember(self._recent_key, worker)

    # -- housekeeping (consumer thread) -----------------------------------------------------

    def _notify_topics(self) -> None:
        self._next_notify = self._clock() + self._notify_period
        try:
            # Every flowengine worker answers this one (TaskFlow workers ignore it).
            self._proxy.publish(pr.Notify(), ext.DISCOVER_ROUTING_KEY, reply_to=self._uuid,
                                headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                                declare_queue=False, retry=False, confirm=False)
        except Exception as err:
            LOG.debug("Could not broadcast a discovery request: %s", err)
        for topic in self._topics:
            try:
                self._proxy.publish(pr.Notify(), topic, reply_to=self._uuid,
                                    headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                                    confirm=False)
            except Exception as err:
                LOG.warning("Could not ask topic %r for workers: %s", topic, err)

    def _housekeeping(self) -> None:
        # The consumer calls this after every drain (every few ms); scanning every in-flight
        # request that often costs more than it saves, and timeouts need no finer grain.
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_PERIOD
            self.on_wait()

    def _note_due(self, when: float) -> None:
        """Something falls due at ``when``: the next scan must not come later."""
        with self._lock:
            if when < self._next_due:
                self._next_due = when

    def on_wait(self) -> None:
        """Expire overdue requests and lapsed leases, forget silent workers (runs periodically)."""
        now = self._clock()
        if now >= self._next_notify:
            self._notify_topics()
        gone = self.finder.expire()
        if gone:
            self._orphaned(gone, "expired")
        with self._lock:
            # Scanning every request in flight costs while thousands are; scan only when the
            # earliest deadline (noted as each one is set) has come.
            if now < self._next_due:
                return
            self._next_due = math.inf
            subs = list(self._ongoing.values())
        for sub in subs:
            request = sub.request
            if request is None:
                continue
            self._note_due(self._deadline(sub, request))
            if request.expired and sub.revoking == request.request_id:
                # Asked not to start, and now past its deadline header: no worker will run it.
                self._cancelled(sub, "it expired unstarted after it was revoked")
            elif request.expired:
                self._fail(sub, exc.RequestTimeout(
                    f"Request {request.request_id} for task {sub.task.name!r} has expired "
                    f"after waiting for {request.timeout} seconds for it to transition out "
                    f"of (WAITING, PENDING) states"))
            elif request.current_state == pr.RUNNING:
                limit = self._time_limit(sub.task)
                if limit and sub.started is not None and now - sub.started > limit:
                    self._fail(sub, exc.TaskTimeLimitExceeded(sub.task.name, limit,
                                                              elapsed=now - sub.started))
                elif sub.lease_until is not None and now > sub.lease_until:
                    self._lapse(sub, sub.suspect or "its lease lapsed (no heartbeat)")

    def _deadline(self, sub: Submission, request: pr.Request) -> float:
        """When ``sub``'s attempt next needs looking at (expiry, time limit or lease)."""
        if request.current_state in pr.WAITING_STATES:
            return (math.inf if request.timeout is None
                    else request.created_on + request.timeout)
        due = math.inf
        if request.current_state == pr.RUNNING:
            limit = self._time_limit(sub.task)
            if limit and sub.started is not None:
                due = sub.started + limit
            if sub.lease_until is not None:
                due = min(due, sub.lease_until)
        return due

    def _orphaned(self, workers: list[TopicWorker], why: str) -> None:
        ids = {w.identity for w in workers}
        with self._lock:
            # By the identity of the attempt's holder, which a RUNNING reply may have moved
            # to a worker this executor has not discovered yet.
            held = [s for s in self._ongoing.values()
                    if s.workers and s.workers[-1] in ids and s.request is not None
                    and s.request.current_state in (pr.PENDING, pr.RUNNING)]
        for sub in held:
            self._lapse(sub, f"its worker {sub.workers[-1]} {why}")

    def _lapse(self, sub: Submission, why: str) -> None:
        """The current attempt is lost: try again elsewhere, or give up and park it."""
        request = sub.request
        assert request is not None
        LOG.warning("Attempt %d of task %r (request %s, worker %s) is lost: %s",
                    sub.attempts, sub.task.name, request.request_id,
                    sub.workers[-1] if sub.workers else "?", why)
        self._events.emit("task-lost", **self._event_fields(sub), reason=why,
                          worker=sub.workers[-1] if sub.workers else None)
        if sub.attempts - sub.resent < self._max_attempts:
            self._new_attempt(sub)
            self._events.emit("task-retried", **self._event_fields(sub), reason=why)
            return
        error = exc.WorkerLost(sub.task.name, sub.attempts, list(sub.workers))
        self._park(sub, request, f"{error}; the last one: {why}")
        self._fail(sub, error)

    def _park(self, sub: Submission, request: pr.Request, reason: str) -> None:
        """Publish the request as a dead letter an operator can list and requeue."""
        headers = self._headers(sub, request)
        topic = sub.worker.topic if sub.worker else sub.topic
        try:
            dead_letters.park(self._proxy, request, headers, reason, topic, sub.workers,
                              reply_to=self._uuid)
        except Exception as err:
            LOG.error("Could not park request %s of task %r as a dead letter: %s",
                      request.request_id, sub.task.name, err)
