"""WorkerTaskExecutor: runs an engine's tasks on remote workers and hands back futures.

One *submission* (an atom's execute or revert) may take several *attempts*. Each attempt is a
:class:`~flowengine.worker_based.engine_side.lifecycle.Attempt` value with its own id, sent as
the message's ``correlation_id`` (TaskFlow workers echo it as they echo anything), so a late
reply from an earlier attempt can never complete a later one. Requests wait in WAITING until a
capable worker is known and are published the moment one appears; replies are consumed as they
arrive.

Everything that happens to an attempt (a reply, a worker's news, the clock) is an event for
:func:`~flowengine.worker_based.engine_side.lifecycle.step`, which says what the attempt
becomes and what to do; this class keeps the attempts in flight and does it. A RUNNING attempt
on a flowengine worker holds a lease the worker's heartbeats renew. When it lapses (worker
killed, frozen or cut off) the submission is re-dispatched as a new attempt, preferably to
another worker; after ``max_attempts`` the atom fails with
:class:`~flowengine.exceptions.WorkerLost` and the request is parked as a dead letter.

A request sent to a flowengine worker's topic that nobody takes within ``pickup_timeout``,
while nothing at all (no reply, no heartbeat) is heard from that topic, is not waited for: a
worker that announces itself and never consumes (forged, or cut off from its queue) would hold
it until its transition timeout. The topic's workers are passed over, the request is revoked
(CANCEL) and sent to another capable worker, without counting an attempt. If the topic is
heard from, the workers of it not heard from lately are asked for a proof of life: one that
leaves it unanswered for a lease (frozen, holding requests it took and never started) is sent
nothing more until heard from, and the topic's untaken requests go elsewhere the same way.
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

from flowengine import context
from flowengine import exceptions as exc
from flowengine import hooks as hk
from flowengine.context import TaskContext
from flowengine.engines import executor as local
from flowengine.task import EVENT_UPDATE_PROGRESS, Task
from flowengine.types.failure import Failure
from flowengine.utils.cycle_free import WeakMethod
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import client as bc
from flowengine.worker_based import dead_letters as dl
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import secret_arguments as sa
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker.connection import TransportSpec
from flowengine.worker_based.broker.delivery import Delivery
from flowengine.worker_based.engine_side import delayed_dispatch as dd
from flowengine.worker_based.engine_side import lifecycle as lc
from flowengine.worker_based.engine_side import outgoing, unserved
from flowengine.worker_based.engine_side.replies import Progress, read
from flowengine.worker_based.options import WorkerEngineOptions
from flowengine.worker_based.types import TopicWorker, WorkerFinder, header
from flowengine.worker_based.wire import versions as vs

LOG = logging.getLogger(__name__)

# The process's client owns the reply queue, its consumer and the discovery rounds now; the
# names stay where TaskFlow-era code looks for them.
PROOF_OF_LIFE = lc.PROOF_OF_LIFE
REPLY_QUEUE_EXPIRES = bc.REPLY_QUEUE_EXPIRES
CONSUMER_START_TIMEOUT = bc.CONSUMER_START_TIMEOUT
HOUSEKEEPING_PERIOD = bc.HOUSEKEEPING_PERIOD
NOTIFY_PERIOD = bc.NOTIFY_PERIOD
#: Seconds between looks for workers that fell silent (an engine's clock).
_EXPIRY_CHECK_PERIOD = 1.0


class RemoteFuture(cf.Future):
    """The engine's handle on a submission.

    Before the request is published, :meth:`cancel` cancels it at once. After that a worker may
    already run it, and cancelling would let it run unobserved (a "ghost"): :meth:`cancel` then
    asks the workers to drop it (``on_revoke``) and returns False, and the future is cancelled
    later, by :meth:`revoked`, only once it is certain the request never ran.
    """

    def __init__(self) -> None:
        super().__init__()
        self.published = False
        self.on_cancel: Callable[[], object] | None = None
        self.on_revoke: Callable[[], None] | None = None

    def cancel(self) -> bool:
        if self.published:
            if self.on_revoke is not None and not self.done():
                self.on_revoke()
            return False
        cancelled = super().cancel()
        if cancelled:
            on_cancel = self.on_cancel
            self._forget_callbacks()
            if on_cancel is not None:
                on_cancel()
        return cancelled

    def revoked(self) -> bool:
        """Cancel a published submission that is known never to have run."""
        cancelled = super().cancel()
        self._forget_callbacks()
        return cancelled

    def set_result(self, result: object) -> None:
        self._forget_callbacks()
        super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        self._forget_callbacks()
        super().set_exception(exception)

    def _forget_callbacks(self) -> None:
        # Done, the future needs them no more; they refer to the submission that refers to
        # the future (a reference cycle, which only a full collection would free).
        self.on_cancel = self.on_revoke = None


@dataclasses.dataclass(eq=False)
class _Submission:
    """One atom's execute or revert: what every attempt at it sends, and where it stands."""

    task: Task
    uuid: str
    body: pr.WorkUnit
    future: RemoteFuture
    attempt: lc.Attempt
    context: TaskContext | None = None
    on_delayed_job: Callable[[str], None] | None = None
    delayed_job: str | None = None  # the broker's handle of its delayed job (beanstalkd)


@dataclasses.dataclass(frozen=True)
class _Parked:
    """A request as a dead letter is made of (see :func:`~.dead_letters.park`)."""

    body: pr.WorkUnit
    request_id: str

    def to_dict(self) -> dict[str, Any]:
        return self.body.to_dict()


class WorkerTaskExecutor(local.WorkExecutor):
    """Executes tasks on workers reached through a broker (flowengine workers await ``async
    def`` methods, see :mod:`~flowengine.worker_based.worker_side.async_runner`).

    Args:
        uuid: this executor's id (its flow's; events carry it).
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
        quiet_start: let a flowengine worker answer a short task with its outcome alone, no
            RUNNING reply first (protocol 2: one message less per task). Such an attempt shows
            PENDING while it runs, so a worker killed or frozen in those first moments is found
            by the broker handing its request back, not by a lease. None (the default): only
            where the broker does that at once, when the worker's connection drops or misses
            its heartbeats (AMQP); elsewhere (Redis hands it back after its visibility
            timeout, 30s) workers say RUNNING first.

    Raises:
        ValueError: A bad value, naming it, as the worker-based engine's options are checked
            (:class:`~flowengine.worker_based.options.WorkerEngineOptions`); the engine itself
            builds its executor from that record (:meth:`from_options`).
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
        transport: TransportSpec | None = None,
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
        quiet_start: bool | None = None,
    ) -> None:
        # TaskFlow's constructor, and flowengine's keywords: validated as the engine's options
        # are, into the one record the engine hands over (see from_options).
        given = {"exchange": exchange, "topics": list(topics),
                 "transition_timeout": transition_timeout, "url": url, "transport": transport,
                 "transport_options": transport_options, "retry_options": retry_options,
                 "worker_expiry": worker_expiry, "taskflow_compat": taskflow_compat,
                 "clock": clock, "lease_timeout": lease_timeout,
                 "heartbeat_interval": heartbeat_interval, "max_attempts": max_attempts,
                 "time_limits": time_limits, "signing_key": signing_key,
                 "signing_key_file": signing_key_file, "unserved_timeout": unserved_timeout,
                 "dead_letter_ttl": dead_letter_ttl, "connect_timeout": connect_timeout,
                 "pickup_timeout": pickup_timeout, "quiet_start": quiet_start}
        self._configure(uuid, WorkerEngineOptions.from_mapping(given), events, secret_args)

    @classmethod
    def from_options(cls, uuid: str, options: WorkerEngineOptions, *,
                     events: ext.EventSink = ext.NO_EVENTS,
                     secret_args: sa.SecretArgs = sa.task_secret_args) -> WorkerTaskExecutor:
        """An executor configured by a worker-based engine's validated options (what the
        engine uses: nothing is validated or converted again).

        Args:
            uuid: This executor's id (its flow's).
            options: The engine's options; those of the engine alone (events, metrics...)
                are not read.
            events, secret_args: As for the constructor.
        """
        executor = cls.__new__(cls)
        executor._configure(uuid, options, events, secret_args)
        return executor

    def _configure(self, uuid: str, options: WorkerEngineOptions, events: ext.EventSink,
                   secret_args: sa.SecretArgs) -> None:
        self._uuid = uuid
        #: The hooks told of each request as it is sent (Hook.request_sent): those of the
        #: engine that runs this executor, which sets them; none for an executor on its own.
        self.hooks = hk.Hooks()
        self._broker = bc.Broker(
            options.exchange, url=options.url, transport=options.transport,
            transport_options=options.transport_options, retry_options=options.retry_options,
            taskflow_compat=options.taskflow_compat,
            signing=sg.Signing.from_options(options.signing_key, options.signing_key_file))
        self._topics = list(options.topics)
        self._policy = lc.Policy(timeout=options.transition_timeout,
                                 lease_timeout=options.lease_timeout,
                                 heartbeat_interval=options.heartbeat_interval,
                                 max_attempts=options.max_attempts,
                                 unserved_timeout=options.unserved_timeout,
                                 pickup_timeout=options.pickup_timeout)
        self._clock = clock = options.clock
        self._quiet_start = options.quiet_start
        self._time_limits = dict(options.time_limits or {})
        self._dead_letter_ttl = options.dead_letter_ttl
        self._secret_args = secret_args
        self._connect_timeout = options.connect_timeout
        self._events = events
        self._lock = threading.RLock()
        #: The submissions in flight, by the request id of their current attempt.
        self._ongoing: dict[str, _Submission] = {}
        self._never_started: set[str] = set()
        self._next_due = math.inf  # the earliest expiry, time limit or lease end in flight
        self._next_expiry_check = -math.inf
        self._looked_at = 0  # attempts the housekeeping looked at (see statistics)
        self.finder = WorkerFinder(options.worker_expiry, clock=clock,
                                   on_change=WeakMethod(self._worker_appeared, None),
                                   topics=self._topics)
        self._dispatch_pending = threading.Event()
        #: Requests leave in the order the engine made them (a one-thread worker then takes
        #: them in that order): while a pass over the waiting requests runs, or one of them
        #: found no worker, a new request is left to the next pass instead of overtaking them.
        self._passing = False
        self._held_back = False
        self._client: bc.Client | None = None
        #: The reply consumer's idle drains at the last pass, and when (this executor's clock)
        #: it was last seen to have read every reply (see lc.Tick.caught_up).
        self._drains_seen = -1
        self._caught_up: float | None = None
        #: Some attempt's verdict (pickup, lease) waits for the reply queue to catch up: the
        #: next pass that sees it caught up looks at them at once.
        self._verdicts_wait = False
        #: Request ids chosen for the next first attempt of an atom (see reserve_request_id).
        self._reserved: dict[str, str] = {}
        #: What a dead predecessor left: request ids to revoke, delayed jobs to delete.
        self._stale: list[str] = []
        self._stale_jobs: list[str] = []

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def client(self) -> bc.Client:
        """The process's broker client this executor is a view on."""
        client = self._client
        return client if client is not None else bc.client_for(self._broker)

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

    def attempts(self) -> list[lc.Attempt]:
        """The attempts in flight now, one per submission (values: a snapshot)."""
        with self._lock:
            return [sub.attempt for sub in self._ongoing.values()]

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
        # Nothing sent yet can have an unread reply: caught up as of now.
        self._drains_seen, self._caught_up = client.proxy.idle_drains, self._clock()
        self._client = client
        for worker in known:
            self.finder.add(worker.topic, worker.tasks, identity=worker.identity,
                            capacity=worker.capacity, flowengine=worker.flowengine,
                            protocol=worker.protocol)
            if worker.silent:  # another engine of the process found it so (Client.silenced)
                self.finder.silence(worker.identity)
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
            state = sub.attempt.state
            self._apply(sub, lc.Abandoned("stopped", exc.RequestTimeout(
                f"Request for task {sub.task.name!r} was still {state} when its executor "
                f"stopped")))

    def wait_for_workers(self, workers: int = 1, timeout: float | None = None) -> int:
        """Block until ``workers`` workers are known; return how many are still missing."""
        return self.finder.wait_for_workers(workers, timeout)

    # -- what a dead predecessor left -------------------------------------------------------

    def revoke_at_start(self, request_ids: Iterable[str]) -> None:
        """Ask every flowengine worker, as this executor starts, not to run ``request_ids``:
        requests a dead engine left queued, which a resumed one sends again as new attempts.

        A worker that takes one of them later settles it unrun (see
        :mod:`~flowengine.worker_based.cancellation`); one already running is not
        stopped.
        """
        self._stale.extend(request_ids)

    def delete_at_start(self, jobs: Iterable[str]) -> None:
        """Delete, as this executor starts, the delayed jobs (stored handles) a dead engine
        left waiting in the broker."""
        self._stale_jobs.extend(jobs)

    def _take_back_leftovers(self) -> None:
        jobs, self._stale_jobs = self._stale_jobs, []
        if jobs:
            # Before the CANCEL: a job deleted here can never reach a worker that missed it.
            LOG.info("Deleted %d of %d delayed request(s) a previous run left",
                     dd.delete_jobs(jobs), len(jobs))
        stale, self._stale = self._stale, []
        if stale:
            outgoing.revoke(self.client.proxy, stale,
                            "its engine's process died; the flow is resumed")

    # -- submitting -------------------------------------------------------------------------

    def submit(self, work: local.Work) -> cf.Future:
        """Send ``work`` to a worker; with a ``delay`` (seconds), no worker takes it before
        then (see :mod:`~flowengine.worker_based.engine_side.delayed_dispatch`), and
        ``on_delayed_job`` is given the broker's handle of the delayed job once it is put
        (beanstalkd), on whichever thread puts it."""
        task, task_uuid = work.task, work.task_uuid
        if work.action == local.REVERT:
            if task_uuid in self._never_started:
                # Its execute never reached a worker (no worker, or none in time): there is
                # nothing to undo, and sending the revert would only wait for a worker in vain.
                self._never_started.discard(task_uuid)
                self._reserved.pop(task_uuid, None)
                done: cf.Future = cf.Future()
                done.set_result((pr.ACTION_TO_EVENT[pr.REVERT], None))
                return done
            body = pr.WorkUnit.of(task, pr.REVERT, work.arguments, work.result, work.failures)
            return self._submit(task, task_uuid, body, work.progress_callback)
        # A new run of the atom: whatever an earlier, never-started one left is moot.
        self._never_started.discard(task_uuid)
        not_before = self._clock() + work.delay if work.delay > 0 else None
        return self._submit(task, task_uuid, pr.WorkUnit.of(task, pr.EXECUTE, work.arguments),
                            work.progress_callback, not_before, work.on_delayed_job)

    def _submit(self, task: Task, task_uuid: str, body: pr.WorkUnit,
                progress_callback: local.ProgressCallback | None,
                not_before: float | None = None,
                on_delayed_job: Callable[[str], None] | None = None) -> cf.Future:
        future = RemoteFuture()
        if progress_callback is not None:
            # Progress EVENTs are re-emitted on the local task's notifier, as TaskFlow does.
            notifier = task.notifier
            notifier.register(EVENT_UPDATE_PROGRESS, progress_callback)
            future.add_done_callback(
                lambda _f: notifier.deregister(EVENT_UPDATE_PROGRESS, progress_callback))
        # The first attempt's id was stored with the atom's state (reserve_request_id).
        request_id = self._reserved.pop(task_uuid, None) or uuid_mod.uuid4().hex
        limit = self._time_limit(task)
        attempt = lc.first(request_id, task.name, body.action, self._policy, self._clock(),
                           time_limit=limit, not_before=not_before,
                           awaited=limit is not None and body.action in local.async_methods(task))
        sub = _Submission(task, task_uuid, body, future, attempt,
                          context=context.active(),  # made current by the engine around this
                          on_delayed_job=on_delayed_job)
        future.on_cancel = functools.partial(self._apply, sub, lc.Abandoned("cancelled"))
        future.on_revoke = functools.partial(self._revoke, sub)
        self._track(sub)
        if self._overtakes(sub):
            self._worker_appeared()  # sent by the next pass, after those made before it
        else:
            self._dispatch(sub)
        return future

    def _overtakes(self, sub: _Submission) -> bool:
        """Whether publishing ``sub`` now could send it ahead of a request made before it:
        one still waiting for a worker, or being sent by a pass over the waiting ones."""
        if self._passing or self._dispatch_pending.is_set():
            return True
        if not self._held_back:
            return False
        with self._lock:
            earlier = any(other.attempt.state == lc.WAITING
                          for other in self._ongoing.values() if other is not sub)
            self._held_back = earlier
        return earlier

    def _track(self, sub: _Submission) -> None:
        with self._lock:
            self._ongoing[sub.attempt.request_id] = sub
            self.client.route(sub.attempt.request_id, self)
        self._note_due(lc.due(sub.attempt, self._clock()))

    def _time_limit(self, task: Task) -> float | None:
        limit = self._time_limits.get(task.name, task.time_limit)
        return float(limit) if limit else None

    # -- the lifecycle, carried out -----------------------------------------------------------

    def _apply(self, sub: _Submission, event: lc.Event, request_id: str | None = None) -> bool:
        """Apply ``event`` to ``sub``'s current attempt (only if it is ``request_id``, when
        given) and do what the lifecycle says; whether this call changed the attempt."""
        now = self._clock()
        with self._lock:
            before = sub.attempt
            if request_id is not None and before.request_id != request_id:
                return False  # about an attempt that has been replaced since
            after, effects = lc.step(before, event, now)
            if after is not before:
                sub.attempt = after
                if after.ended:
                    self._untrack(before.request_id)
                elif before.state == lc.WAITING and after.state == lc.PENDING:
                    sub.future.published = True
                self._account(before, after)
                due = lc.due(after, now)
                if due < self._next_due:
                    self._next_due = due
        for effect in effects:
            self._carry_out(sub, before, effect, now)
        return after is not before

    def _account(self, before: lc.Attempt, after: lc.Attempt) -> None:
        """Keep the workers' in-flight counts (lock held): the least loaded gets the next."""
        held_before = before.worker if before.state in (lc.PENDING, lc.RUNNING) else None
        held_after = after.worker if after.state in (lc.PENDING, lc.RUNNING) else None
        if held_before == held_after:
            return
        gone = self.finder.get(held_before)
        if gone is not None:
            gone.in_flight = max(gone.in_flight - 1, 0)
        taken = self.finder.get(held_after)
        if taken is not None:
            taken.in_flight += 1

    def _carry_out(self, sub: _Submission, before: lc.Attempt, effect: lc.Effect,
                   now: float) -> None:
        attempt = sub.attempt
        if isinstance(effect, lc.Announce):
            self._events.emit(effect.event_type, **self._event_fields(sub, before),
                              **effect.fields)
        elif isinstance(effect, lc.Complete):
            self._complete(sub, effect.result)
        elif isinstance(effect, lc.Fail):
            self._fail(sub, before, effect.error)
        elif isinstance(effect, lc.Expire):
            self._fail(sub, before, exc.RequestTimeout(effect.message + self._why_waiting(before)))
        elif isinstance(effect, lc.Unserved):
            self._fail(sub, before, exc.NotFound(unserved.describe(
                pr.task_class_name(sub.task), sub.task.name, self._topics, self.finder.workers(),
                now - before.created, vs.major(sub.task.version)) + effect.note))
        elif isinstance(effect, lc.Cancel):
            LOG.info("Cancelled %s: %s", before.describe(), effect.why)
            sub.future.revoked()
        elif isinstance(effect, lc.Retry):
            self._next_attempt(sub)
            if effect.reason is not None:
                self._events.emit("task-retried", **self._event_fields(sub, sub.attempt),
                                  reason=effect.reason)
        elif isinstance(effect, lc.Park):
            self._park(sub, before, effect.reason)
        elif isinstance(effect, lc.Withdraw):
            # From the dispatch thread: this one may be the consumer, which must never wait
            # on a publish retrying through an outage.
            self.client.submit(functools.partial(outgoing.revoke, self.client.proxy,
                                                 [before.request_id], effect.why))
        elif isinstance(effect, lc.TellStop):
            reason = attempt.stopping or before.stopping or ""
            self.client.submit(functools.partial(outgoing.stop, self.client.proxy,
                                                 before.request_id, sub.task.name, reason,
                                                 effect.holder))
        elif isinstance(effect, lc.Silence):
            known = self.finder.get(effect.worker)
            # Told once: the other attempts it held lapse too, and its silence is news only once.
            news = known is None or not known.silent
            worker = self.finder.silence(effect.worker)
            if worker is not None:
                LOG.warning("Worker %s (topic %r) is sent nothing until it is heard from "
                            "again: %s", worker.identity, worker.topic, effect.why)
            if news:
                self._share_silence(effect.worker)
        elif isinstance(effect, lc.CheckPickup):
            self._check_pickup(sub, attempt, effect.topic, now)

    def _complete(self, sub: _Submission, result: Any) -> None:
        if not sub.future.done():
            sub.future.set_result((pr.ACTION_TO_EVENT[sub.body.action], result))

    def _fail(self, sub: _Submission, before: lc.Attempt, error: Exception) -> None:
        # Attempts turned away by workers that do not run the class never ran either.
        if (sub.body.action == pr.EXECUTE and before.number - before.tally.not_served == 1
                and before.waiting):
            # Sent nowhere, or never picked up before its timeout: it did nothing.
            self._never_started.add(sub.uuid)
        self._complete(sub, Failure.from_exception(error))

    def _next_attempt(self, sub: _Submission) -> None:
        """Send the submission again as a new attempt, from the client's dispatch thread
        (callers may be on its consumer thread, which must never wait on a publish retrying
        through an outage)."""
        with self._lock:
            if not sub.attempt.ended:
                return
            sub.attempt = lc.follow(sub.attempt, uuid_mod.uuid4().hex, self._clock())
        self._track(sub)
        self.client.submit(functools.partial(self._dispatch, sub))

    def _event_fields(self, sub: _Submission, attempt: lc.Attempt) -> dict[str, Any]:
        return {"flow_uuid": self._uuid, "atom_uuid": sub.uuid, "task_name": sub.task.name,
                "request_id": attempt.request_id, "attempt": attempt.number}

    def _untrack(self, request_id: str) -> None:
        """Stop tracking attempt ``request_id`` (and routing its replies here; lock held)."""
        self._ongoing.pop(request_id, None)
        client = self._client
        if client is not None:
            client.unroute(request_id)
            client.held.withdraw(request_id)  # a delayed request held for it is moot

    def _note_due(self, when: float) -> None:
        """Something falls due at ``when``: the next scan must not come later."""
        with self._lock:
            if when < self._next_due:
                self._next_due = when

    # -- dispatching ------------------------------------------------------------------------

    def _dispatch(self, sub: _Submission) -> None:
        """Publish a WAITING attempt to the best capable worker, if one is known."""
        attempt = sub.attempt
        if attempt.state != lc.WAITING or sub.future.done():
            return
        worker = self._worker_for(sub)
        if worker is None:
            LOG.debug("No worker yet for %r; request %s waits", sub.task.name,
                      attempt.request_id)
            with self._lock:
                self._held_back = True
            return
        if not self._apply(sub, lc.Sent(worker.identity, worker.topic, worker.flowengine),
                           attempt.request_id):
            # Sent meanwhile by another thread (the engine's submit and a pass over the
            # waiting requests when a worker appears can both find it WAITING): published
            # once, by that one.
            return
        sent = sub.attempt
        if sent.request_id != attempt.request_id or sent.state != lc.PENDING:
            return  # it moved on meanwhile (cancelled, or already sent)
        secret = sa.for_request(self._secret_args(sub.task), sub.body.arguments)
        headers = outgoing.request_headers(sent, self._uuid, sub.uuid, sub.context, secret,
                                           quiet_start=self.quiet_starts)
        self.hooks.request_sent(headers, sub.uuid, request_id=sent.request_id,
                                attempt=sent.number, task_name=sub.task.name,
                                topic=worker.topic)
        publish = functools.partial(self._publish, sub, sent, worker.topic, headers)
        now = self._clock()
        delay = 0.0 if sent.not_before is None else sent.not_before - now
        if delay <= 0:
            publish()
            return
        if pr.HEADER_DEADLINE in headers:
            headers[pr.HEADER_DEADLINE] += delay
        sub.delayed_job = dd.dispatch_later(self.client, sent.request_id, delay, headers,
                                            publish)
        if sub.delayed_job is not None and sub.on_delayed_job is not None:
            sub.on_delayed_job(sub.delayed_job)

    @property
    def quiet_starts(self) -> bool:
        """Whether this engine's requests let short tasks reply with their outcome alone:
        option ``quiet_start``, or by default whether the broker is an AMQP one (which hands
        back at once what a dead or frozen worker held)."""
        if self._quiet_start is not None:
            return self._quiet_start
        # The broker must hand back promptly what a worker dead or frozen in a short task's
        # first moments held: no lease covers an attempt that has not said it runs.
        return bool(self.client.proxy.traits.heartbeats)

    def _quiet_on(self, topic: str) -> bool:
        """Whether an attempt sent to ``topic`` may be running without having said so."""
        return self.quiet_starts and self.finder.quiet_starts(topic)

    def _publish(self, sub: _Submission, attempt: lc.Attempt, topic: str,
                 headers: dict[str, Any]) -> None:
        proxy = self.client.proxy
        try:
            # Unconfirmed on one broker: a confirm costs a round trip per request, and a
            # request the broker loses is not lost silently (it fails after
            # transition_timeout). Confirmed on quorum queues: a cluster drops an unconfirmed
            # publish while a queue elects a new leader after a node died, which a confirm
            # turns into a nack that is sent again.
            proxy.publish(
                sub.body, topic, reply_to=self.client.reply_to,
                correlation_id=attempt.request_id, headers=headers,
                priority=sub.task.priority, confirm=proxy.queue_kind.quorum,
                # Through an outage, as long as the request may wait anyway.
                deadline=self._policy.timeout)
        except Exception as err:
            LOG.warning("Publishing request %s for %r to topic %r failed: %s",
                        attempt.request_id, sub.task.name, topic, err)
            self._apply(sub, lc.Unsendable(Failure()), attempt.request_id)

    def refuse(self, request_id: str, error: Exception) -> None:
        """Give up attempt ``request_id`` as it is about to be sent (its engine cannot record
        it): it is never published, and its atom fails with ``error``."""
        with self._lock:
            sub = self._ongoing.get(request_id)
        if sub is not None:
            # Called while the attempt is announced (task-sent), before it is published:
            # ended here, _dispatch finds it no longer PENDING and publishes nothing.
            self._apply(sub, lc.Abandoned("its engine cannot record it", error), request_id)

    def _worker_for(self, sub: _Submission) -> TopicWorker | None:
        """The best worker to send ``sub``'s next attempt to (its task's class at its major
        version, avoiding the workers its earlier attempts went to if it can); None: none."""
        return self.finder.get_worker_for_task(pr.task_class_name(sub.task),
                                               avoid=sub.attempt.tally.workers,
                                               major=vs.major(sub.task.version))

    def _runnable(self, sub: _Submission) -> bool:
        """Whether a known worker can run ``sub``'s task now."""
        return self.finder.get_worker_for_task(pr.task_class_name(sub.task),
                                               major=vs.major(sub.task.version)) is not None

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
        self._passing = True  # before the pending pass is cleared: no gap to slip through
        self._dispatch_pending.clear()
        try:
            with self._lock:
                waiting = [s for s in self._ongoing.values() if s.attempt.state == lc.WAITING]
            for sub in waiting:
                self._dispatch(sub)
        finally:
            self._passing = False

    # -- revoking and stopping ----------------------------------------------------------------

    def _taken_back(self, sub: _Submission) -> bool:
        """Whether a delayed attempt was withdrawn before any worker could take it."""
        attempt = sub.attempt
        return (attempt.state == lc.PENDING and not attempt.revoking
                and attempt.not_before is not None
                and dd.withdraw(self._client, attempt.request_id, sub.delayed_job))

    def _revoke(self, sub: _Submission) -> None:
        """The engine is suspending: keep the current attempt from starting if it still waits."""
        self._apply(sub, lc.Revoke(self._taken_back(sub)), sub.attempt.request_id)

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
            subs = [s for s in self._ongoing.values() if s.body.action == pr.EXECUTE]
        # Newest first, and those known to run last: a worker hears its STOPs in the order
        # they are sent (its control queue), so it knows a request queued behind another is
        # dropped before the one ahead of it ends and frees the thread the queued one would
        # take. (A short task's RUNNING reply may not have come yet: sent earlier, it is
        # the likelier to run.)
        subs.reverse()
        subs.sort(key=lambda s: s.attempt.state == lc.RUNNING)
        for sub in subs:
            self._apply(sub, lc.Stop(reason, self._taken_back(sub)), sub.attempt.request_id)

    # -- replies and worker news (the client's consumer thread) -------------------------------

    def on_reply(self, data: Any, message: Delivery) -> None:
        """Apply a RESPONSE for one of this executor's attempts (the client's consumer)."""
        correlation_id = message.correlation_id
        headers = message.headers or {}
        worker = header(headers, pr.HEADER_WORKER)
        if self.finder.seen(worker, header(headers, pr.HEADER_CAPACITY)):
            client = self._client  # it was silent: the process's other engines hear it too
            if client is not None:
                client.heard_again(worker, self)
        with self._lock:
            sub = self._ongoing.get(correlation_id)
        if sub is None:
            # A reply to an attempt that already finished or lapsed (late, duplicate, or from
            # a worker that woke up): applying it would complete an atom twice.
            # A late outcome is worth a line; a RUNNING or progress reply may trail the outcome
            # it precedes (flowengine workers send them unconfirmed), which is routine.
            level = logging.INFO if data.get("state") in (pr.SUCCESS, pr.FAILURE) else logging.DEBUG
            LOG.log(level, "Ignoring %s reply for unknown or finished request %s",
                    data.get("state"), correlation_id)
            return
        attempt = sub.attempt
        runner = None if attempt.runner is None else (correlation_id, attempt.runner)
        impostor = sg.foreign_sender(runner, correlation_id, headers, data)
        if impostor is not None:
            sg.refuse_impostor(message, impostor)
            return
        if attempt.topic:
            self.finder.heard_on(attempt.topic)  # its queue is consumed
        try:
            event = read(data, headers)
        except Exception as err:
            # Valid by schema yet undecodable: fail the attempt rather than wait on it forever.
            LOG.warning("Undecodable %s reply for request %s of task %r: %s",
                        data.get("state"), correlation_id, sub.task.name, err)
            event = lc.Broken(exc.InvalidFormat(
                f"The {data.get('state')} reply for task {sub.task.name!r} (request "
                f"{correlation_id}) could not be decoded: {err}"))
        if event is None:
            LOG.warning("Ignoring reply in state %s for request %s", data.get("state"),
                        correlation_id)
            return
        if isinstance(event, Progress):
            if event.waiting_for is not None:
                self._apply(sub, lc.Waiting(holding=bool(event.waiting_for)), correlation_id)
            sub.task.notifier.notify(event.event_type, event.details)
            return
        if isinstance(event, lc.HandedBack) and attempt.state == lc.PENDING:
            event = dataclasses.replace(event, quiet_start=self._quiet_on(attempt.topic))
        if isinstance(event, lc.NotServed) and event.version is not None:
            alive = self.finder.get_worker_for_task(pr.task_class_name(sub.task),
                                                    major=vs.major(sub.task.version))
            event = dataclasses.replace(event, right_version_alive=alive is not None)
        self._apply(sub, event, correlation_id)

    def on_notify(self, data: Any, message: Delivery) -> None:
        """Learn of a worker (or its going offline) from an announcement or NOTIFY reply."""
        headers = message.headers or {}
        identity = header(headers, pr.HEADER_WORKER)
        if header(headers, pr.HEADER_WORKER_STATUS) == pr.WORKER_OFFLINE:
            if identity:
                gone = self.finder.remove(identity)
                if gone is not None:
                    self._orphaned([gone], "went offline")
            return
        self.finder.add(data["topic"], data["tasks"], identity=identity,
                        capacity=header(headers, pr.HEADER_CAPACITY),
                        flowengine=header(headers, pr.HEADER_PROTOCOL) is not None,
                        versions=vs.decode(header(headers, vs.HEADER_TASK_VERSIONS)),
                        protocol=header(headers, pr.HEADER_PROTOCOL))

    def _orphaned(self, workers: list[TopicWorker], why: str) -> None:
        ids = {w.identity for w in workers}
        with self._lock:
            # By the identity of the attempt's holder, which a RUNNING reply may have moved
            # to a worker this executor has not discovered yet.
            held = [s for s in self._ongoing.values() if s.attempt.worker in ids]
        for sub in held:
            attempt = sub.attempt
            quiet = attempt.state == lc.PENDING and self._quiet_on(attempt.topic)
            self._apply(sub, lc.Lost(f"its worker {attempt.worker} {why}", quiet_start=quiet),
                        attempt.request_id)

    # -- housekeeping (the client's consumer thread) ----------------------------------------

    def resumed(self, outage: float) -> None:
        """The process's broker connection is back after ``outage`` seconds.

        Its own disconnection does not count against the workers: every running attempt's
        lease and every worker's liveness start afresh, with time for the heartbeats and
        outcomes that waited in the reply queue to be drained before any lease is judged.
        """
        with self._lock:
            subs = list(self._ongoing.values())
        for sub in subs:
            self._apply(sub, lc.Resumed(outage), sub.attempt.request_id)
        for worker in self.finder.workers():
            self.finder.seen(worker.identity)

    def on_wait(self) -> None:
        """Expire overdue requests and lapsed leases, forget silent workers (runs periodically)."""
        now = self._clock()
        client = self._client
        if client is not None and client.proxy.idle_drains != self._drains_seen:
            # The reply consumer found its queue empty since the last pass: every reply sent
            # before then has been read (see lc.Tick.caught_up).
            self._drains_seen = client.proxy.idle_drains
            self._caught_up = now
            if self._verdicts_wait:  # this is what they wait for (see lc.awaits_catch_up)
                self._note_due(now)
        if now < self._next_due and now < self._next_expiry_check:
            # The usual pass (the client looks at thousands of engines ten times a second):
            # nothing is due. _next_due is only ever lowered under the lock; a value read
            # just before it was lowered is seen on the next pass, one period later.
            return
        if now >= self._next_expiry_check:
            self._next_expiry_check = now + _EXPIRY_CHECK_PERIOD
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
        self._looked_at += len(subs)
        tick = lc.Tick(workers_known=self.finder.total_workers > 0, caught_up=self._caught_up)
        # A waiting request that a known worker can run is only waiting for its pass over the
        # waiting requests, queued behind other engines' work on the client's dispatch thread
        # (thousands of flows): it is not unserved.
        queued = lc.Tick(workers_known=False, caught_up=self._caught_up)
        waiting_verdict = False
        for sub in subs:
            attempt = sub.attempt
            self._note_due(lc.due(attempt, now))
            event = tick
            if tick.workers_known and attempt.state == lc.WAITING:
                if self._runnable(sub):
                    event = queued
                    self._worker_appeared()  # a pass is queued, if none is
                elif self.finder.runs(pr.task_class_name(sub.task), vs.major(sub.task.version)):
                    # Its workers fell silent (a lease lapsed, a proof of life unanswered):
                    # one may be heard from again (a paused VM resumes), so it waits its
                    # transition timeout, not the short one for a class nobody runs.
                    event = queued
            self._apply(sub, event, attempt.request_id)
            waiting_verdict = waiting_verdict or lc.awaits_catch_up(sub.attempt, now)
        self._verdicts_wait = waiting_verdict
        if self.finder.asking:  # after the pickup checks above, which may have just asked
            self._judge_unanswered(now)

    def unheld_suspects(self) -> list[tuple[str, str]]:
        """Its requests sent at least :data:`~.client.HELD_CHECK_PERIOD` ago that no worker
        said it runs: ``(request id, topic)`` (the client asks the broker whether it still
        holds them)."""
        now = self._clock()
        with self._lock:
            return [(s.attempt.request_id, s.attempt.topic) for s in self._ongoing.values()
                    if s.attempt.state == lc.PENDING and not s.attempt.revoking
                    and s.attempt.not_before is None and s.delayed_job is None
                    and now - s.attempt.created >= bc.HELD_CHECK_PERIOD]

    def unheld(self, request_id: str, why: str) -> None:
        """The broker no longer holds request ``request_id`` (its worker died taking it, or
        the broker lost it): the attempt is lost, as with a lost worker."""
        with self._lock:
            sub = self._ongoing.get(request_id)
        if sub is not None:
            self._apply(sub, lc.Lost(why, quiet_start=self._quiet_on(sub.attempt.topic),
                                     unheld=True), request_id)

    def _why_waiting(self, attempt: lc.Attempt) -> str:
        if attempt.state == lc.WAITING and self.finder.total_workers == 0:
            broker = self.client.broker
            return unserved.no_worker(broker.exchange, self._topics,
                                      unserved.listed_queues(broker))
        return ""

    def _check_pickup(self, sub: _Submission, attempt: lc.Attempt, topic: str,
                      now: float) -> None:
        """Nobody took the PENDING attempt within ``pickup_timeout``: unless its topic was
        heard from meanwhile (busy, not absent), pass its workers over and send the request
        to another capable worker, if there is one (else it goes on waiting where it is)."""
        bound = self._policy.pickup_timeout or 0.0
        if self.finder.ask(topic, now - max(bound, NOTIFY_PERIOD)):
            # A worker of the topic not heard from lately may have taken it and frozen (or
            # lost its process with its connection still open): every live flowengine worker
            # answers a discovery round from its control consumer, however busy its tasks
            # keep it. One that does not is judged in _judge_unanswered. The round costs
            # little: a worker is asked only when none of its answers arrived within a
            # NOTIFY_PERIOD, when the client's next regular round is due anyway (this one
            # stands in for it).
            self.client.ask_workers()
            self._note_due(now + self._answer_window)
        if not self.finder.quiet_since(topic, now - bound):
            return
        passed = self.finder.pass_over(topic)
        other = self.finder.get_worker_for_task(pr.task_class_name(sub.task),
                                                avoid=attempt.tally.workers)
        if other is None or other.passed_over or attempt.tally.rerouted >= lc.MAX_NOT_SERVED:
            LOG.debug("Task %r (request %s) waits untaken on topic %r: no other worker runs it",
                      sub.task.name, attempt.request_id, topic)
            return
        LOG.warning("%s is sent elsewhere: nobody took it from topic %r within %gs and nothing "
                    "was heard from the topic; its %d worker(s) (%s) are passed over until "
                    "heard from", attempt.describe().capitalize(), topic, bound, len(passed),
                    ", ".join(w.identity for w in passed[:3])
                    + (", ..." if len(passed) > 3 else ""))
        self._apply(sub, lc.PassOver(), attempt.request_id)

    @property
    def _answer_window(self) -> float:
        """Seconds a worker asked for a proof of life has to answer (as long as a running
        attempt's lease: the silence this engine already takes for a lost worker)."""
        return self._policy.lease_timeout or NOTIFY_PERIOD

    def _judge_unanswered(self, now: float) -> None:
        """Send again, elsewhere, the untaken requests of the topics of workers that left a
        proof of life unanswered (see :meth:`_check_pickup`)."""
        window = self._answer_window
        for worker in self.finder.unanswered(window, self._caught_up):
            why = (f"worker {worker.identity} of topic {worker.topic!r}, which may hold it "
                   f"unstarted, did not answer within {window:g}s")
            LOG.warning("Worker %s (topic %r) is sent nothing until it is heard from again: "
                        "it did not answer within %gs while a request of its topic waited "
                        "untaken", worker.identity, worker.topic, window)
            self._share_silence(worker.identity)
            self._pass_over_held_by(worker, why, now)
        if self.finder.asking:
            self._note_due(self.finder.next_verdict(window, now))
            # An answer still unread in a backlog of replies is what a verdict waits for.
            self._verdicts_wait = True

    def _share_silence(self, identity: str) -> None:
        """Tell the process's other engines that worker ``identity`` fell silent."""
        client = self._client
        if client is not None:
            client.silenced(identity, self)

    def worker_silenced(self, identity: str) -> None:
        """Another engine of this process found worker ``identity`` silent: this one sends
        it nothing either until it is heard from again, by any engine of the process (its own
        attempts there keep their leases, which decide them)."""
        # Logged where it was found (a thousand engines would log it a thousand times here).
        if self.finder.silence(identity) is not None:
            LOG.debug("Worker %s is sent nothing until it is heard from again: another engine "
                      "of this process found it silent", identity)

    def worker_heard(self, identity: str) -> None:
        """Another engine of this process heard from worker ``identity``, which it took for
        silent: this one may send it work again too."""
        self.finder.seen(identity)

    def _pass_over_held_by(self, worker: TopicWorker, why: str, now: float) -> None:
        """Send the untaken requests of ``worker``'s topic to other workers: it may hold any
        of them unstarted. Each is revoked as it goes (a thawed worker drops it unrun) and
        costs no attempt; one that no other worker can run waits where it is."""
        with self._lock:
            subs = [s for s in self._ongoing.values()
                    if s.attempt.state == lc.PENDING and s.attempt.topic == worker.topic
                    and s.attempt.flowengine_peer and not s.attempt.revoking
                    and (s.attempt.not_before is None or s.attempt.not_before <= now)
                    and s.attempt.tally.rerouted < lc.MAX_NOT_SERVED]
        for sub in subs:
            attempt = sub.attempt
            if self._worker_for(sub) is None:
                LOG.debug("%s stays where it is: no other worker runs it",
                          attempt.describe().capitalize())
                continue
            LOG.warning("%s is sent elsewhere: %s", attempt.describe().capitalize(), why)
            self._apply(sub, lc.PassOver(why), attempt.request_id)

    def _park(self, sub: _Submission, attempt: lc.Attempt, reason: str) -> None:
        """Publish the request as a dead letter an operator can list and requeue."""
        secret = sa.for_request(self._secret_args(sub.task), sub.body.arguments)
        headers = outgoing.request_headers(attempt, self._uuid, sub.uuid, sub.context, secret,
                                           quiet_start=self.quiet_starts)
        topic = attempt.topic
        worker = self.finder.get(attempt.worker)
        if worker is not None:
            topic = worker.topic
        try:
            dl.park(self.client.proxy, _Parked(sub.body, attempt.request_id), headers, reason,
                    topic, list(attempt.tally.workers), reply_to=self.client.reply_to,
                    ttl=self._dead_letter_ttl)
        except Exception as err:
            LOG.error("Could not park request %s of task %r as a dead letter: %s",
                      attempt.request_id, sub.task.name, err)
