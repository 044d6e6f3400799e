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
import dataclasses
import functools
import logging
import math
import threading
import time
import uuid as uuid_mod
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flowengine import context, tracing
from flowengine import exceptions as exc
from flowengine.engines import executor as local
from flowengine.task import EVENT_UPDATE_PROGRESS
from flowengine.types.failure import Failure
from flowengine.worker_based import attempt as at
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import client as bc
from flowengine.worker_based import dead_letters as dl
from flowengine.worker_based import delayed_dispatch as dd
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import running_calls as rn
from flowengine.worker_based import secret_arguments as sa
from flowengine.worker_based import signing as sg
from flowengine.worker_based import tracking
from flowengine.worker_based import versions as vs
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.leftovers import Leftovers
from flowengine.worker_based.submission import RemoteFuture, Submission
from flowengine.worker_based.tracking import AttemptTracking
from flowengine.worker_based.types import WorkerFinder

LOG = logging.getLogger(__name__)

# The process's client owns the reply queue, its consumer and the discovery rounds now; the
# names stay where TaskFlow-era code looks for them.
PROOF_OF_LIFE = tracking.PROOF_OF_LIFE
REPLY_QUEUE_EXPIRES = bc.REPLY_QUEUE_EXPIRES
CONSUMER_START_TIMEOUT = bc.CONSUMER_START_TIMEOUT
HOUSEKEEPING_PERIOD = bc.HOUSEKEEPING_PERIOD
NOTIFY_PERIOD = bc.NOTIFY_PERIOD


@dataclasses.dataclass(frozen=True)
class _AttemptSnapshot:
    """An attempt in flight, as :meth:`WorkerTaskExecutor.attempts` shows it."""

    task_name: str
    request_id: str
    state: str
    lease_until: float | None
    worker: str | None


class WorkerTaskExecutor(AttemptTracking, Leftovers, local.TaskExecutor):
    """Executes tasks on workers reached through a broker (flowengine workers await ``async
    def`` methods, see :mod:`~flowengine.worker_based.async_runner`).

    Args:
        uuid: this executor's id; its reply queue is ``<exchange>_<uuid>``.
        exchange: the exchange workers listen on.
        topics: the worker topics its requests may go to (asked for workers; flowengine
            workers also announce themselves). A worker of another topic is never sent
            anything, as with TaskFlow; with no topic listed, any worker on the exchange may be.
        transition_timeout: seconds a request may stay WAITING/PENDING before it fails with
            RequestTimeout (None: forever).
        url, transport, transport_options, retry_options, taskflow_compat: broker settings, see
            :class:`~flowengine.worker_based.broker.proxy.Proxy`.
        worker_expiry: seconds after which a silent worker is forgotten.
        clock: monotonic clock (tests inject one to move time without sleeping).
        notify_period: ignored: the process's broker client asks every topic in use for
            workers every :data:`NOTIFY_PERIOD` seconds.
        lease_timeout: seconds a RUNNING request on a flowengine worker may go without a
            heartbeat before it is re-dispatched (None: never).
        heartbeat_interval: seconds between the heartbeats workers are asked to send.
        max_attempts: attempts per submission before the atom fails with WorkerLost.
        time_limits: per task name, seconds a RUNNING attempt may take (overrides the task
            class's ``time_limit``); past it the attempt fails with TaskTimeLimitExceeded.
        events: where task-sent, task-moved, task-retried and task-lost events go.
        signing_key, signing_key_file: the key engines and workers share to sign messages
            (default: ``FLOWENGINE_SIGNING_KEY``), see :mod:`~flowengine.worker_based.signing`.
        unserved_timeout: seconds a request may wait while workers are known but none of
            them runs its task class, before it fails with NotFound naming the class, the
            topics and what their workers do run (None: wait for transition_timeout). With no
            worker known at all, transition_timeout applies.
        dead_letter_ttl: seconds a request parked as a dead letter is kept (default 14
            days), see :mod:`~flowengine.worker_based.dead_letters`.
        secret_args: gives the names of a task's arguments whose values are secret (default:
            its ``secret_args``); requests name them in a header, see
            :mod:`~flowengine.worker_based.secret_arguments`.
        connect_timeout: seconds :meth:`start` waits for the broker connection before it
            raises :class:`~flowengine.worker_based.backoff.BrokerUnreachable` naming the
            broker (each failed attempt is logged meanwhile).
        pickup_timeout: seconds a request sent to a flowengine worker may wait untaken while
            nothing is heard from its topic, before that topic's workers are passed over and
            the request is revoked and sent to another capable worker, if there is one
            (None: never).
    """

    runs_coroutines = True
    #: :meth:`execute_task` takes ``delay`` (the engine's retry path dispatches with it).
    delays_dispatch = True

    def __init__(
        self,
        uuid: str,
        exchange: str,
        topics: Iterable[str],
        transition_timeout: float | None = pr.REQUEST_TIMEOUT,
        url: str | None = None,
        transport: Any = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | bo.RetryOptions | None = None,
        worker_expiry: float | None = pr.EXPIRES_AFTER,
        taskflow_compat: bool = False,
        clock: Callable[[], float] = time.monotonic,
        notify_period: float = NOTIFY_PERIOD,
        lease_timeout: float | None = ext.DEFAULT_LEASE_TIMEOUT,
        heartbeat_interval: float = ext.DEFAULT_HEARTBEAT_INTERVAL,
        max_attempts: int = ext.DEFAULT_MAX_ATTEMPTS,
        time_limits: Mapping[str, float] | None = None,
        events: ext.EventSink = ext.NO_EVENTS,
        signing_key: str | None = None,
        signing_key_file: str | None = None,
        unserved_timeout: float | None = ext.DEFAULT_UNSERVED_TIMEOUT,
        dead_letter_ttl: float = dl.DEFAULT_TTL,
        secret_args: sa.SecretArgs = sa.task_secret_args,
        connect_timeout: float = bc.CONSUMER_START_TIMEOUT,
        pickup_timeout: float | None = ext.DEFAULT_PICKUP_TIMEOUT,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if lease_timeout is not None and lease_timeout <= heartbeat_interval:
            raise ValueError(f"lease_timeout ({lease_timeout}s) must be longer than "
                             f"heartbeat_interval ({heartbeat_interval}s)")
        self._uuid = uuid
        self._broker = bc.Broker(exchange, url=url, transport=transport,
                                 transport_options=transport_options,
                                 retry_options=retry_options, taskflow_compat=taskflow_compat,
                                 signing=sg.Signing.from_options(signing_key, signing_key_file))
        self._topics = list(topics)
        self._transition_timeout = transition_timeout
        self._clock = clock
        self._next_expiry_check = -math.inf
        self._next_due = math.inf  # the earliest expiry, time limit or lease end in flight
        self._lease_timeout = lease_timeout
        self._heartbeat_interval = heartbeat_interval
        self._max_attempts = max_attempts
        self._time_limits = dict(time_limits or {})
        self._unserved_timeout = unserved_timeout
        self._pickup_timeout = pickup_timeout
        self._dead_letter_ttl = dead_letter_ttl
        self._secret_args = secret_args
        self._connect_timeout = connect_timeout
        self._events = events
        self._looked_at = 0  # attempts the housekeeping looked at (see statistics)
        self._lock = threading.RLock()
        self._ongoing: dict[str, Submission] = {}
        self._never_started: set[str] = set()
        self.finder = WorkerFinder(worker_expiry, clock=clock, on_change=self._worker_appeared,
                                   topics=self._topics)
        self._dispatch_pending = threading.Event()
        self._client: bc.Client | None = None
        #: Request ids chosen for the next first attempt of an atom (see reserve_request_id).
        self._reserved: dict[str, str] = {}
        Leftovers.__init__(self)

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def client(self) -> bc.Client:
        """The process's broker client this executor is a view on."""
        client = self._client
        return client if client is not None else bc.client_for(self._broker)

    @property
    def _proxy(self) -> px.Proxy:
        return self.client.proxy

    def start(self) -> None:
        """Attach to the process's broker client (starting it on first use).

        Workers the process already knows are known at once; a discovery round is sent only
        when none are, or when this executor names a topic not asked before.
        """
        if self._client is not None:
            return
        while True:
            client = bc.client_for(self._broker)
            try:
                known = client.attach(self, self._topics, self._connect_timeout)
                break
            except bc.ClientClosed:
                continue  # it lingered out just now: the next one is new
        self._client = client
        for worker in known:
            self.finder.add(worker.topic, worker.tasks, identity=worker.identity,
                            capacity=worker.capacity, flowengine=worker.flowengine)
        self._take_back_leftovers()

    def reserve_request_id(self, task_uuid: str) -> str | None:
        request_id = self._reserved[task_uuid] = uuid_mod.uuid4().hex
        return request_id

    def stop(self) -> None:
        """Detach from the broker client; submissions still outstanding fail with
        RequestTimeout (the client stays open for the process's other engines)."""
        client, self._client = self._client, None
        with self._lock:
            leftovers = list(self._ongoing.values())
            routed = list(self._ongoing)
        if client is not None:
            client.detach(self, self._topics, routed)
        for sub in leftovers:
            state = sub.request.current_state if sub.request else pr.WAITING
            self._fail(sub, exc.RequestTimeout(
                f"Request for task {sub.task.name!r} was still {state} when its executor "
                f"stopped"))

    @property
    def events(self) -> ext.EventSink:
        """Where this executor reports what happens to its attempts (task-sent, -moved,
        -retried, -lost)."""
        return self._events

    @property
    def statistics(self) -> dict[str, int]:
        """Counters: ``attempts_looked_at``, attempts the housekeeping examined (it looks
        only when a deadline falls due, so thousands in flight cost nothing meanwhile)."""
        return {"attempts_looked_at": self._looked_at}

    def attempts(self) -> list[_AttemptSnapshot]:
        """The attempts in flight now, one per submission (a snapshot)."""
        with self._lock:
            subs = list(self._ongoing.values())
        return [_AttemptSnapshot(s.task.name, s.request.request_id, s.request.current_state,
                                s.lease_until, s.workers[-1] if s.workers else None)
                for s in subs if s.request is not None]

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
        delay: float = 0.0,
        on_delayed_job: Callable[[str], None] | None = None,
    ) -> cf.Future:
        """Run ``task`` on a worker; with ``delay`` (seconds), no worker takes it before then
        (see :mod:`~flowengine.worker_based.delayed_dispatch`). ``on_delayed_job`` is given the
        broker's handle of the delayed job once it is put (beanstalkd), on whichever thread
        puts it."""
        sub = Submission(task, task_uuid, pr.EXECUTE, arguments, pr.NO_RESULT, None,
                         RemoteFuture(),
                         not_before=self._clock() + delay if delay > 0 else None,
                         on_delayed_job=on_delayed_job)
        return self._submit(sub, progress_callback)

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
            self._reserved.pop(task_uuid, None)
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
        sub.context = context.active()  # made current by the engine around this call
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
                self._untrack(sub.request.request_id)

    def _new_attempt(self, sub: Submission, defer: bool = False) -> None:
        """Start the submission's next attempt and dispatch it (``defer``: from the client's
        dispatch thread, for callers on its consumer thread, which must never wait on a
        publish retrying through an outage)."""
        if sub.stopping is not None and sub.request is not None:
            # Its flow is being cancelled: the attempt handed back unrun is not sent again.
            self._cancelled(sub, "its flow is being cancelled")
            return
        request = pr.Request(
            sub.task, sub.uuid, sub.action, sub.arguments, timeout=self._transition_timeout,
            result=sub.result, failures=sub.failures, clock=self._clock,
            attempt=sub.attempts + 1,
            # The first attempt's id was stored with the atom's state (reserve_request_id).
            request_id=self._reserved.pop(sub.uuid, None) if sub.attempts == 0 else None)
        with self._lock:
            if sub.request is not None:
                self._untrack(sub.request.request_id)
            if sub.worker is not None:
                sub.worker.in_flight = max(sub.worker.in_flight - 1, 0)
            sub.attempts += 1
            sub.request, sub.worker, sub.suspect, sub.delayed_job = request, None, None, None
            sub.pickup_due = None
            sub.attempt = at.Attempt(
                f"attempt {sub.attempts} of task {sub.task.name!r} (request "
                f"{request.request_id})", self._clock, timeout=self._transition_timeout,
                lease_timeout=self._lease_timeout, time_limit=self._time_limit(sub.task))
            self._ongoing[request.request_id] = sub
            self.client.route(request.request_id, self)
            # A delayed request's timeouts count from when it may be taken.
            delay = self._delay_left(sub)
            request.created_on += delay
            sub.attempt.created += delay
        if request.timeout is not None:
            self._note_due(request.created_on + request.timeout)  # its expiry
        if defer:
            self.client.submit(functools.partial(self._dispatch, sub))
        else:
            self._dispatch(sub)

    def _dispatch(self, sub: Submission) -> None:
        """Publish a WAITING attempt to the best capable worker, if one is known."""
        request = sub.request
        assert request is not None
        worker = self.finder.get_worker_for_task(pr.task_class_name(sub.task), avoid=sub.workers,
                                                 major=vs.major(sub.task.version))
        if worker is None:
            LOG.debug("No worker yet for %r; request %s waits", sub.task.name, request.request_id)
            if self._unserved_timeout is not None:
                self._note_due(request.created_on + self._unserved_timeout)
            return
        with self._lock:
            if (request.current_state != pr.WAITING or sub.request is not request
                    or sub.future.done()):
                return
            request.transition(pr.PENDING)
            self._advance(sub, at.DISPATCH)
            worker.in_flight += 1
            sub.worker, sub.topic = worker, worker.topic
            sub.workers.append(worker.identity)
            sub.future.published = True
            if worker.flowengine and self._pickup_timeout is not None:
                # TaskFlow workers cannot be told to drop a request sent elsewhere instead.
                sub.pickup_due = self._clock() + self._delay_left(sub) + self._pickup_timeout
                self._note_due(sub.pickup_due)
        # Announced before publishing, so task-sent always precedes the worker's task-received.
        self._events.emit("task-sent", **self._event_fields(sub), topic=worker.topic,
                          worker=worker.identity, action=sub.action)
        headers = self._headers(sub, request)
        tracing.request_sent(headers, sub.uuid, request_id=request.request_id,
                             attempt=request.attempt, task_name=sub.task.name,
                             topic=worker.topic)
        publish = functools.partial(self._publish, sub, request, worker.topic, headers)
        delay = self._delay_left(sub)
        if delay <= 0:
            publish()
            return
        if pr.HEADER_DEADLINE in headers:
            headers[pr.HEADER_DEADLINE] += delay
        sub.delayed_job = dd.dispatch_later(self.client, request.request_id, delay, headers,
                                            publish)
        if sub.delayed_job is not None and sub.on_delayed_job is not None:
            sub.on_delayed_job(sub.delayed_job)

    def _delay_left(self, sub: Submission) -> float:
        return 0.0 if sub.not_before is None else max(0.0, sub.not_before - self._clock())

    def _publish(self, sub: Submission, request: pr.Request, topic: str,
                 headers: dict[str, Any]) -> None:
        try:
            # Unconfirmed: a confirm costs a broker round trip per request. A request the
            # broker loses is not lost silently: it fails after transition_timeout.
            self._proxy.publish(request, topic, reply_to=self.client.reply_to,
                                correlation_id=request.request_id, headers=headers,
                                priority=getattr(sub.task, "priority", 0), confirm=False,
                                # Through an outage, as long as the request may wait anyway.
                                deadline=self._transition_timeout)
        except Exception as err:
            LOG.warning("Publishing request %s for %r to topic %r failed: %s",
                        request.request_id, sub.task.name, topic, err)
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
            pr.HEADER_FLOW_UUID: self._uuid,
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
        headers.update(rn.context_headers(sub.context))
        if self._lease_timeout is not None:
            headers[ext.HEADER_HEARTBEAT] = self._heartbeat_interval
            headers[ext.HEADER_LEASE] = self._lease_timeout
        secret = sa.for_request(self._secret_args(sub.task), request.arguments)
        if secret:
            headers[sa.HEADER_SECRET_ARGS] = secret
        return headers

    def _worker_appeared(self) -> None:
        if not self._ongoing:
            # Nothing to send (an engine attaching learns the known workers this way): a
            # request made from now on finds the worker as it is dispatched.
            return
        if self._dispatch_pending.is_set():
            return  # a pass over the waiting requests is already queued
        self._dispatch_pending.set()
        self.client.submit(self.dispatch_waiting)

    def dispatch_waiting(self) -> None:
        """Publish the requests that wait for a worker (one appeared)."""
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
            if request is None or self._untrack(request.request_id) is None:
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
        if sub.not_before is not None and dd.withdraw(self._client, request.request_id,
                                                       sub.delayed_job):
            self._cancelled(sub, "it was taken back before a worker took it")
            return
        try:
            # Every flowengine worker hears it (TaskFlow workers do not; theirs are waited for).
            self._proxy.publish(cn.Cancel([request.request_id]), ext.DISCOVER_ROUTING_KEY,
                                headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                                declare_queue=False, confirm=False)
        except Exception as err:
            LOG.warning("Could not ask workers to drop request %s of task %r: %s; waiting for "
                        "it instead", request.request_id, sub.task.name, err)

    def stop_executions(self, reason: str) -> None:
        """Take back the executes not started and stop those running on workers (their flow
        is being cancelled), see :mod:`~flowengine.worker_based.running_calls`.

        One never sent, or still held back by its delay, is cancelled here. Any other gets a
        STOP: to the worker that said it holds it, else to every flowengine worker; a worker
        drops it unrun if it still waits there (answering that it never ran), or tells the
        task running it. The STOP is sent again with each heartbeat or RUNNING reply the
        request sends until it ends, and a request whose worker is lost is not sent again.
        """
        with self._lock:
            subs = [s for s in self._ongoing.values()
                    if s.action == pr.EXECUTE and s.request is not None]
            for sub in subs:
                assert sub.request is not None
                sub.stopping = reason
                # A worker's answer that it dropped it unrun is then believed, whatever the
                # engine last heard (its RUNNING reply may precede the coroutine's start).
                sub.revoking = sub.request.request_id
        for sub in subs:
            request = sub.request
            if request is None:
                continue
            if request.current_state == pr.WAITING:
                self._cancelled(sub, "it was never sent")
            elif (sub.not_before is not None
                  and dd.withdraw(self._client, request.request_id, sub.delayed_job)):
                self._cancelled(sub, "it was taken back before a worker took it")
            else:
                self._tell_stop(sub)

    def _tell_stop(self, sub: Submission, holder: str | None = None) -> None:
        """Send a stopping submission's attempt a STOP, from the client's dispatch thread
        (never the consumer's: a publish may retry through an outage)."""
        request, reason = sub.request, sub.stopping
        if request is None or reason is None or request.current_state not in (
                pr.PENDING, pr.RUNNING):
            return
        if holder is None and sub.running_by is not None \
                and sub.running_by[0] == request.request_id:
            holder = sub.running_by[1]
        # To the worker holding it when one said so; else to every flowengine worker.
        key = ext.control_routing_key(holder) if holder else ext.DISCOVER_ROUTING_KEY
        stop = rn.Stop([request.request_id], reason)

        def publish() -> None:
            try:
                self._proxy.publish(stop, key, headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION},
                                    declare_queue=False, confirm=False, retry=False)
            except Exception as err:  # the next heartbeat tries again
                LOG.warning("Could not ask workers to stop request %s of task %r: %s",
                            request.request_id, sub.task.name, err)

        self.client.submit(publish)

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
        # Attempts turned away by workers that do not run the class never ran either.
        if (sub.action == pr.EXECUTE and sub.attempts - sub.not_served == 1
                and request is not None
                and request.current_state in pr.WAITING_STATES):
            # Sent nowhere, or never picked up before its timeout: it did nothing.
            self._never_started.add(sub.uuid)
        self._finish(sub, Failure.from_exception(error))

    def _untrack(self, request_id: str) -> Submission | None:
        """Stop tracking attempt ``request_id`` (and routing its replies here)."""
        sub = self._ongoing.pop(request_id, None)
        client = self._client
        if client is not None:
            client.unroute(request_id)
            client.held.withdraw(request_id)  # a delayed request held for it is moot
        return sub
