"""How the attempts in flight progress and end: replies, worker news and the clock.

The half of :class:`~flowengine.worker_based.executor.WorkerTaskExecutor` that runs on the
process's broker client's consumer thread: it applies each reply (RUNNING, heartbeats,
progress, hand-backs, outcomes) and worker announcement to the attempt it concerns, and
judges every attempt's lifecycle (:mod:`~flowengine.worker_based.attempt`) by the clock:
expiries, time limits and lapsed leases, re-dispatching or parking what is lost.

A request sent to a flowengine worker's topic that nobody takes within ``pickup_timeout``,
while nothing at all (no reply, no heartbeat) is heard from that topic, is not waited for: a
worker that announces itself and never consumes (forged, or cut off from its queue) would hold
it until its transition timeout. The topic's workers are passed over, the request is revoked
(CANCEL) and sent to another capable worker, without counting an attempt. A busy topic is
never passed over: the requests it runs reply and send heartbeats.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.worker_based import attempt as at
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import client as bc
from flowengine.worker_based import dead_letters, unserved
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import limits as lm
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import signing as sg
from flowengine.worker_based import versions as vs
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker.delivery import Delivery
from flowengine.worker_based.submission import Submission
from flowengine.worker_based.types import TopicWorker, WorkerFinder, header

LOG = logging.getLogger("flowengine.worker_based.executor")

#: Heartbeat intervals a worker holding a RUNNING attempt the broker handed out again has to
#: show it is alive before the attempt is lost.
PROOF_OF_LIFE = 1.5
#: Hand-backs by workers of another version a request may have while one of its own version
#: lives (each sent again a little later, up to a second apart).
MAX_OTHER_VERSION = 200
#: Seconds between looks for workers that fell silent (an engine's clock).
_EXPIRY_CHECK_PERIOD = 1.0


class AttemptTracking:
    """Replies and the clock applied to an executor's attempts (a mixin of the executor,
    which provides the state and the completing methods declared here)."""

    _lock: threading.RLock
    _ongoing: dict[str, Submission]
    _clock: Callable[[], float]
    _lease_timeout: float | None
    _heartbeat_interval: float
    _max_attempts: int
    _unserved_timeout: float | None
    _pickup_timeout: float | None
    _dead_letter_ttl: float
    _topics: list[str]
    _events: ext.EventSink
    _next_due: float
    _next_expiry_check: float
    _looked_at: int
    finder: WorkerFinder
    #: Asks every flowengine worker not to run these request ids (the executor's Leftovers).
    _revoke_ids: Callable[[list[str], str], None]

    @property
    def client(self) -> bc.Client:
        raise NotImplementedError

    @property
    def _proxy(self) -> px.Proxy:
        raise NotImplementedError

    def _fail(self, sub: Submission, error: Exception) -> None:
        raise NotImplementedError

    def _finish(self, sub: Submission, result: Any) -> None:
        raise NotImplementedError

    def _cancelled(self, sub: Submission, why: str) -> None:
        raise NotImplementedError

    def _tell_stop(self, sub: Submission, holder: str | None = None) -> None:
        raise NotImplementedError

    def _new_attempt(self, sub: Submission, defer: bool = False) -> None:
        raise NotImplementedError

    def _event_fields(self, sub: Submission) -> dict[str, Any]:
        raise NotImplementedError

    def _headers(self, sub: Submission, request: pr.Request) -> dict[str, Any]:
        raise NotImplementedError

    # -- replies (the client's consumer thread) ---------------------------------------------

    def on_reply(self, data: Any, message: Delivery) -> None:
        """Apply a RESPONSE for one of this executor's attempts (the client's consumer)."""
        correlation_id = message.correlation_id
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
        impostor = sg.foreign_sender(sub.running_by, correlation_id, headers, data)
        if impostor is not None:
            sg.refuse_impostor(message, impostor)
            return
        if sub.topic:
            self.finder.heard_on(sub.topic)  # its queue is consumed
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
                if sub.stopping is not None:  # asked to stop and still running: ask again
                    self._tell_stop(sub, header(headers, pr.HEADER_WORKER))
            elif event_type == ext.EVENT_REDELIVERED:
                self._handed_back(sub, request, header(headers, pr.HEADER_WORKER))
            elif event_type == ext.EVENT_NOT_SERVED:
                self._not_served(sub, request, header(headers, pr.HEADER_WORKER),
                                 response.data["details"].get("version"))
            elif event_type == cn.EVENT_CANCELLED:
                # Unstarted, or an awaited coroutine the worker stopped as asked (its RUNNING
                # reply may have come first): either way it will not finish.
                if (request.current_state in pr.WAITING_STATES
                        or sub.revoking == request.request_id):
                    by = header(headers, pr.HEADER_WORKER) or "?"
                    self._cancelled(sub, f"worker {by} dropped it unstarted, as asked")
            else:
                if response.data["details"].get(lm.WAITING_FOR) is not None:
                    self._still_waiting(sub, request)
                sub.task.notifier.notify(response.data["event_type"], response.data["details"])
        elif state == pr.RUNNING:
            if sub.running_by is None or sub.running_by[0] != correlation_id:
                sub.running_by = (correlation_id, header(headers, pr.HEADER_WORKER))
            request.transition_and_log_error(pr.RUNNING, logger=LOG)
            attempt = sub.attempt
            if attempt is not None and attempt.state == at.PENDING:
                if header(headers, pr.HEADER_PROTOCOL) is None:
                    # Only flowengine workers send heartbeats: a TaskFlow worker's request
                    # holds no lease.
                    attempt.lease_timeout = None
                self._advance(sub, at.START)
            self._holder(sub, header(headers, pr.HEADER_WORKER))
            self._renew(sub, headers)
            self._note_due(self._deadline(sub, request))  # its time limit or lease
            if sub.stopping is not None:  # it started after its flow's cancel: stop it
                self._tell_stop(sub, header(headers, pr.HEADER_WORKER))
        elif state in (pr.SUCCESS, pr.FAILURE):
            if request.current_state == pr.PENDING:
                # The RUNNING reply was lost or overtaken; the outcome still counts.
                request.transition_and_log_error(pr.RUNNING, logger=LOG)
            if request.transition_and_log_error(state, logger=LOG):
                self._advance(sub, at.FINISH)
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
            if sub.attempt is not None:
                sub.attempt.shorten(due)
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
        self._new_attempt(sub, defer=True)

    def _not_served(self, sub: Submission, request: pr.Request, by: str | None,
                    version: str | None = None) -> None:
        """A worker sharing the topic turned the attempt away unrun: it does not run the class
        (or not at this major version). It is sent again without counting an attempt, to a
        worker that announced the class (at this version)."""
        if request.current_state != pr.PENDING:
            return  # late or duplicated: the attempt moved on
        task_cls = pr.task_class_name(sub.task)
        major = vs.major(sub.task.version)
        if (version is not None and sub.other_version < MAX_OTHER_VERSION
                and self.finder.get_worker_for_task(task_cls, major=major) is not None):
            # A rolling upgrade: workers of both versions share the topic's queue, and one of
            # the other took it. One of its own version lives: it is sent again, a little later
            # each time, so that while those are busy it does not bounce between the others.
            sub.other_version += 1
            sub.not_served += 1
            sub.not_before = self._clock() + min(0.02 * 2 ** (sub.other_version - 1), 1.0)
            LOG.info("Worker %s runs version %s of task class %r: sending task %r (version %s,"
                     " request %s) again", by or "?", version, task_cls, sub.task.name,
                     vs.text(sub.task.version), request.request_id)
            self._new_attempt(sub, defer=True)
            return
        if sub.not_served >= ext.MAX_NOT_SERVED + sub.other_version:
            self._fail(sub, exc.NotFound(unserved.describe(
                task_cls, sub.task.name, self._topics, self.finder.workers(),
                self._clock() - request.created_on, major)
                + f"\n(handed back {sub.not_served + 1} times, the last by worker {by})"))
            return
        LOG.info("Worker %s does not run task class %r: sending task %r (request %s) again",
                 by or "?", task_cls, sub.task.name, request.request_id)
        sub.not_served += 1
        self._new_attempt(sub, defer=True)

    def _still_waiting(self, sub: Submission, request: pr.Request) -> None:
        """A worker holds the request unstarted until a concurrency limit lets it run (see
        :mod:`~flowengine.worker_based.limits`): alive and waiting in line, so its time to
        leave PENDING starts again."""
        if request.current_state == pr.PENDING and sub.attempt is not None:
            request.created_on = sub.attempt.created = self._clock()
            self._note_due(self._deadline(sub, request))

    def _renew(self, sub: Submission, headers: Mapping[str, Any]) -> None:
        # Only flowengine workers send heartbeats; a TaskFlow worker's request holds no lease.
        attempt = sub.attempt
        if (attempt is not None and attempt.state == at.RUNNING
                and attempt.lease_timeout is not None
                and header(headers, pr.HEADER_PROTOCOL) is not None):
            # Later than the lease end noted before, so nothing new to note (see on_wait).
            self._advance(sub, at.RENEW)
            sub.suspect = None  # alive after all

    def _advance(self, sub: Submission, event: str) -> None:
        """Apply ``event`` to the current attempt's lifecycle (logged if it does not apply:
        replies can be late or duplicated, and are never a reason to fail)."""
        if sub.attempt is None:
            return
        try:
            sub.attempt.on(event)
        except at.AttemptError as err:
            LOG.debug("%s", err)

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
                        versions=vs.decode(header(headers, vs.HEADER_TASK_VERSIONS)))

    # -- housekeeping (the client's consumer thread) ----------------------------------------

    def resumed(self, outage: float) -> None:
        """The process's broker connection is back after ``outage`` seconds.

        Its own disconnection does not count against the workers: every running attempt's
        lease and every worker's liveness start afresh, with time for the heartbeats and
        outcomes that waited in the reply queue to be drained before any lease is judged.
        """
        grace = outage + PROOF_OF_LIFE * self._heartbeat_interval
        with self._lock:
            for sub in self._ongoing.values():
                if sub.attempt is not None:
                    sub.attempt.extend(grace)
        for worker in self.finder.workers():
            self.finder.seen(worker.identity)
        with self._lock:
            for sub in self._ongoing.values():
                if sub.pickup_due is not None:
                    sub.pickup_due += grace

    def _note_due(self, when: float) -> None:
        """Something falls due at ``when``: the next scan must not come later."""
        with self._lock:
            if when < self._next_due:
                self._next_due = when

    def on_wait(self) -> None:
        """Expire overdue requests and lapsed leases, forget silent workers (runs periodically)."""
        now = self._clock()
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
                    f"of (WAITING, PENDING) states{self._why_waiting(request)}"))
            elif request.current_state == pr.WAITING and self._unserved(request, now):
                self._fail(sub, exc.NotFound(unserved.describe(
                    pr.task_class_name(sub.task), sub.task.name, self._topics,
                    self.finder.workers(), now - request.created_on,
                    vs.major(sub.task.version))))
            elif (request.current_state == pr.PENDING and sub.pickup_due is not None
                    and now >= sub.pickup_due and sub.revoking != request.request_id):
                self._unclaimed(sub, request, now)
            elif request.current_state == pr.RUNNING and sub.attempt is not None:
                attempt = sub.attempt
                verdict = attempt.judge()
                if verdict == at.TIME_OUT and attempt.time_limit and attempt.started is not None:
                    self._advance(sub, at.TIME_OUT)
                    self._fail(sub, exc.TaskTimeLimitExceeded(
                        sub.task.name, attempt.time_limit, elapsed=now - attempt.started))
                elif verdict == at.LAPSE:
                    self._advance(sub, at.LAPSE)
                    self._silent(sub, sub.suspect or "its lease lapsed (no heartbeat)")

    def _deadline(self, sub: Submission, request: pr.Request) -> float:
        """When ``sub``'s attempt next needs looking at (expiry, time limit or lease)."""
        if request.current_state in pr.WAITING_STATES:
            expiry = (math.inf if request.timeout is None
                      else request.created_on + request.timeout)
            if request.current_state == pr.WAITING and self._unserved_timeout is not None:
                fail_fast = request.created_on + self._unserved_timeout
                if fail_fast > self._clock():  # once past, only the expiry is left to wait for
                    return min(expiry, fail_fast)
            if (request.current_state == pr.PENDING and sub.pickup_due is not None
                    and sub.revoking != request.request_id):
                return min(expiry, sub.pickup_due)
            return expiry
        if request.current_state == pr.RUNNING and sub.attempt is not None:
            return sub.attempt.due()
        return math.inf

    def _unserved(self, request: pr.Request, now: float) -> bool:
        """Whether a WAITING request has waited its ``unserved_timeout`` out while workers
        are known (none of which runs its class, or it would have been sent)."""
        return (self._unserved_timeout is not None
                and now - request.created_on >= self._unserved_timeout
                and self.finder.total_workers > 0)

    def _why_waiting(self, request: pr.Request) -> str:
        if request.current_state == pr.WAITING and self.finder.total_workers == 0:
            broker = self.client.broker
            return unserved.no_worker(broker.exchange, self._topics,
                                      unserved.listed_queues(broker))
        return ""

    def _unclaimed(self, sub: Submission, request: pr.Request, now: float) -> None:
        """Nobody took the PENDING attempt within ``pickup_timeout``: unless its topic was
        heard from meanwhile (busy, not absent), pass its workers over and send the request
        to another capable worker, if there is one (else it goes on waiting where it is)."""
        assert self._pickup_timeout is not None
        bound, topic = self._pickup_timeout, sub.topic
        sub.pickup_due = now + bound  # looked at again then, unless it moves on
        if not self.finder.quiet_since(topic, now - bound):
            return
        passed = self.finder.pass_over(topic)
        other = self.finder.get_worker_for_task(pr.task_class_name(sub.task), avoid=sub.workers)
        if other is None or other.passed_over or sub.rerouted >= ext.MAX_NOT_SERVED:
            LOG.debug("Task %r (request %s) waits untaken on topic %r: no other worker runs it",
                      sub.task.name, request.request_id, topic)
            return
        why = (f"nobody took it from topic {topic!r} within {bound:g}s and nothing was heard "
               f"from the topic")
        LOG.warning("Attempt %d of task %r (request %s) is sent elsewhere: %s; its %d "
                    "worker(s) (%s) are passed over until heard from", sub.attempts,
                    sub.task.name, request.request_id, why, len(passed),
                    ", ".join(w.identity for w in passed[:3]) + (", ..." if len(passed) > 3
                                                                   else ""))
        self._advance(sub, at.PASS_OVER)
        sub.rerouted += 1
        # A worker of that topic that shows up later must not run it as well: revoked first,
        # from the dispatch thread (this one must never wait on a publish).
        self.client.submit(lambda: self._revoke_ids([request.request_id], why))
        self._new_attempt(sub, defer=True)
        self._events.emit("task-retried", **self._event_fields(sub), reason=why)

    def _silent(self, sub: Submission, why: str) -> None:
        """The current attempt's holder stopped sending heartbeats: it is dead, frozen or cut
        off. Nothing more (the next attempt, a revert) is sent to it until anything is heard
        from it again. The other attempts it holds keep their own leases: a worker only slow
        to send one heartbeat must not lose all its work at once."""
        holder = self.finder.silence(sub.workers[-1]) if sub.workers else None
        if holder is not None:
            LOG.warning("Worker %s (topic %r) is sent nothing until it is heard from again: %s",
                        holder.identity, holder.topic, why)
        self._lapse(sub, why)

    def _orphaned(self, workers: list[TopicWorker], why: str) -> None:
        ids = {w.identity for w in workers}
        now = self._clock()
        with self._lock:
            # By the identity of the attempt's holder, which a RUNNING reply may have moved
            # to a worker this executor has not discovered yet. A request still in its delay
            # is held by no worker: any worker of the topic may take it when it is due.
            held = [s for s in self._ongoing.values()
                    if s.workers and s.workers[-1] in ids and s.request is not None
                    and s.request.current_state in (pr.PENDING, pr.RUNNING)
                    and (s.not_before is None or s.not_before <= now)]
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
        if sub.stopping is not None:
            # Its flow is being cancelled: not sent again; what it did is reverted.
            self._fail(sub, exc.WorkerLost(sub.task.name, sub.attempts, list(sub.workers)))
            return
        if sub.attempts - sub.resent - sub.not_served - sub.rerouted < self._max_attempts:
            self._new_attempt(sub, defer=True)
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
                              reply_to=self.client.reply_to, ttl=self._dead_letter_ttl)
        except Exception as err:
            LOG.error("Could not park request %s of task %r as a dead letter: %s",
                      request.request_id, sub.task.name, err)
