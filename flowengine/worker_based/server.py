"""The worker side of the protocol: answer discovery, run requested tasks, reply with outcomes.

A REQUEST is acknowledged only after its outcome (SUCCESS or FAILURE) has been published, so a
worker that dies mid-task leaves the request to be redelivered (at-least-once). Replies are
serialized before they are published: a result or exception the wire cannot carry becomes a
FAILURE that says so, instead of a reply that never leaves (where TaskFlow's engine hangs); how
replies are sent is the base class's,
:class:`~flowengine.worker_based.worker_side.replies.ReplySender`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from flowengine import context
from flowengine import exceptions as exc
from flowengine import hooks as hk
from flowengine import task as task_mod
from flowengine.types.failure import Failure
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import endpoint as ep
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import pause as ps
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import running_calls as rn
from flowengine.worker_based import secret_arguments as sa
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker.connection import TransportSpec
from flowengine.worker_based.broker.delivery import Delivery
from flowengine.worker_based.broker_spec import Broker
from flowengine.worker_based.wire import versions as vs
from flowengine.worker_based.worker_side import async_runner as ar
from flowengine.worker_based.worker_side import limits as lm
from flowengine.worker_based.worker_side import replays as rp
from flowengine.worker_based.worker_side.heartbeats import Heartbeats
from flowengine.worker_based.worker_side.limits import WorkerLimits
from flowengine.worker_based.worker_side.replies import (  # noqa: F401 - OUTCOME_PUBLISH_DEADLINE re-exported
    OUTCOME_PUBLISH_DEADLINE,
    ReplySender,
    from_flowengine,
)
from flowengine.worker_based.worker_side.request_reading import (
    MIN_HEARTBEAT_INTERVAL,  # noqa: F401 - re-exported
    clip,
    event_fields,
    first,
    heartbeat_interval,
    make_worker_id,  # noqa: F401 - re-exported
    quiet_start,
    running_after,
    time_limit,
)

LOG = logging.getLogger(__name__)
#: Seconds since the control consumer last began a drain that found its queue empty, past
#: which a request starts only once it has done so again (it drains every few milliseconds
#: when nothing comes: lagging this long, it was frozen with the process, or is working
#: through a backlog).
CONTROL_LAG = 0.5
#: Most seconds a request waits for the control consumer to catch up before it starts anyway.
CONTROL_CATCH_UP = 5.0


class Server(ReplySender):
    """Consumes a worker topic and serves requests with the given endpoints.

    Args:
        topic: The worker topic (queue ``<exchange>_<topic>``).
        exchange: The exchange engines publish to.
        executor: Runs tasks (one request per submitted call).
        endpoints: The task classes this worker runs; nothing else is ever run.
        url, transport, transport_options, retry_options, taskflow_compat: See
            :class:`~flowengine.worker_based.broker.proxy.Proxy`.
        capacity: Task slots (the executor's threads): the prefetch limit, and the free-slot
            count advertised in replies. ``None``: no prefetch limit, nothing advertised.
        worker_id: This worker's identity in headers (generated when not given).
        prefetch: The prefetch limit now, for a pool that grows (asked between drains).
        signing: Signs replies and announcements and checks requests (see
            :mod:`~flowengine.worker_based.signing`; default: the key in the environment).
        async_runner: Awaits the ``async def`` methods (a runner of the default concurrency
            when not given); ``capacity`` should count its slots.
        run_requests: Where the signatures of the signed requests run are kept, so a copy is
            refused (default, with a signing key: the topic's folder on this host, see
            :mod:`~flowengine.worker_based.worker_side.replays`; without a key: none).
        limits: The worker's concurrency limits (see
            :mod:`~flowengine.worker_based.worker_side.limits`).

    Raises:
        ValueError: A signing key with ``taskflow_compat`` (TaskFlow peers cannot sign).
    """

    def __init__(
        self,
        topic: str,
        exchange: str,
        executor: Executor,
        endpoints: Iterable[ep.Endpoint],
        url: str | None = None,
        transport: TransportSpec | None = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | None = None,
        taskflow_compat: bool = False,
        capacity: int | None = None,
        worker_id: str | None = None,
        events: ext.EventSink = ext.NO_EVENTS,
        prefetch: Callable[[], int | None] | None = None,
        signing: sg.Signing | None = None,
        async_runner: ar.AsyncRunner | None = None,
        run_requests: rp.RunRequests | None = None,
        limits: WorkerLimits | None = None,
        hooks: hk.Hooks | None = None,
    ) -> None:
        signing = sg.Signing.from_options() if signing is None else signing
        if signing.enabled and taskflow_compat:
            raise ValueError(f"Worker of topic '{topic}': a signing key cannot be used with "
                             "taskflow_compat (TaskFlow peers neither sign nor check signatures)")
        self._topic = topic
        self._executor = executor
        self._endpoints = {endpoint.name: endpoint for endpoint in endpoints}
        self._capacity = capacity
        self._busy = 0
        self._busy_lock = threading.Lock()
        self.worker_id = worker_id or make_worker_id()
        self._events = events
        #: Called around each request served and at each reply (tracing attaches here).
        self.hooks = hooks if hooks is not None else hk.Hooks(hk.defaults)
        self._online = False
        # Discovery is answered off the task threads, so a busy worker still answers at once.
        self._control = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowengine-control")
        self._heartbeats = Heartbeats()
        self._short_runs = _ShortRuns()
        self._revoked = cn.Revoked()
        self._calls = rn.RunningCalls()
        self._async = async_runner or ar.AsyncRunner()
        self._limits = limits if limits is not None and limits.limits else None
        if self._limits is not None:
            self._limits.worker_id = self.worker_id
        self._slots: dict[int, list[Any]] = {}  # by id(message): released when it is settled
        self.topic_pause = ps.TopicPause(topic, self.worker_id, events, lambda: self._busy)
        handlers = {
            pr.NOTIFY: dp.Handler(
                self._on_notify, functools.partial(pr.Notify.validate, response=False)
            ),
            pr.REQUEST: dp.Handler(self._on_request, pr.Request.validate, manual_ack=True),
        }
        #: The broker this worker consumes from (its topic's queue and its control queue).
        self.broker = Broker(exchange, url=url, transport=transport,
                             transport_options=transport_options, retry_options=retry_options,
                             taskflow_compat=taskflow_compat, signing=signing)
        self._proxy = self.broker.consumer(
            topic, handlers, prefetch_count=capacity,
            on_connected=lambda: self._submit_control(self.announce),
            on_refused=self._on_refused, paused=lambda: self.topic_pause.paused, prefetch=prefetch,
            on_requeue=self._say_returned,
        )  # fmt: skip
        if run_requests is None and signing.enabled:
            run_requests = rp.RunRequests(rp.default_folder(
                self._proxy.connection_details.uri, exchange, topic), signing.window)
        self._run_requests = run_requests
        # A private queue for broadcasts (discovery, cancellations): workers sharing a topic
        # share its queue, so only this one reaches each of them. TaskFlow fleets keep
        # TaskFlow's topology.
        self._control_proxy: px.Proxy | None = None
        if not taskflow_compat:
            control_handlers = {
                pr.NOTIFY: handlers[pr.NOTIFY],
                cn.CANCEL: dp.Handler(self._on_cancel, cn.Cancel.validate),
                rn.STOP: dp.Handler(self._on_stop, rn.Stop.validate),
                ps.PAUSE: dp.Handler(self.topic_pause.on_message, ps.Pause.validate),
            }
            self._control_proxy = self.broker.consumer(
                ext.control_routing_key(self.worker_id), control_handlers,
                extra_routing_keys=[ext.DISCOVER_ROUTING_KEY], transient_queue=True,
            )
        self._control_thread: threading.Thread | None = None

    @property
    def connection_details(self) -> px.ConnectionDetails:
        """The broker URI (password masked) and transport facts."""
        return self._proxy.connection_details

    @property
    def task_names(self) -> list[str]:
        """The task class names this server runs (what NOTIFY replies advertise)."""
        return list(self._endpoints)

    @property
    def task_versions(self) -> dict[str, str]:
        """The version of each task class it runs (those it can tell), as announced."""
        return {name: endpoint.version for name, endpoint in self._endpoints.items()
                if endpoint.version is not None}

    def _notify_headers(self) -> dict[str, Any]:
        """A NOTIFY reply's or announcement's headers: the usual ones and the versions."""
        return {**self._headers(), vs.HEADER_TASK_VERSIONS: vs.encode(self.task_versions)}

    @property
    def free_slots(self) -> int | None:
        """Task slots not running a request, or None when the capacity is unknown."""
        if self._capacity is None:
            return None
        return max(self._capacity - self._busy, 0)

    @property
    def in_flight(self) -> int:
        """Requests taken and not settled yet."""
        return self._busy

    @property
    def revoked_waiting(self) -> int:
        """Request ids this worker was asked not to run, still remembered (their request has
        not reached it yet, or never will)."""
        return len(self._revoked)

    @property
    def prefetch(self) -> int | None:
        """The consumer's prefetch limit now (None: no limit): below the capacity after a
        reconnect while requests taken before it still run."""
        return self._proxy.prefetch_limit

    def _submit_control(self, fn: Any, *args: Any) -> None:
        try:
            self._control.submit(fn, *args)
        except RuntimeError:  # shut down: the worker is stopping
            LOG.debug("Worker %s is stopping; skipped %s", self.worker_id, fn)

    def announce(self, status: str = pr.WORKER_ONLINE) -> None:
        """Tell listening engines this worker's topic, tasks and status (best effort)."""
        notify = pr.Notify(topic=self._topic, tasks=self.task_names)
        headers = dict(self._notify_headers(), **{pr.HEADER_WORKER_STATUS: status})
        try:
            self._proxy.publish(
                notify, pr.DISCOVERY_ROUTING_KEY, headers=headers, declare_queue=False,
                retry=False, expiration=pr.ANNOUNCEMENT_TTL,
            )  # fmt: skip
            self._online = status == pr.WORKER_ONLINE
            self._events.emit(f"worker-{status}", worker=self.worker_id, topic=self._topic,
                              tasks=self.task_names, capacity=self._capacity,
                              versions=self.task_versions)
        except Exception as err:
            # An outage its transport reported already (a full disk) is not logged per try.
            LOG.log(logging.DEBUG if getattr(err, "reported", False) else logging.WARNING,
                    "Worker %s could not announce itself %s: %s", self.worker_id, status, err)

    def _on_notify(self, data: Any, message: Delivery) -> None:
        if not self._proxy.is_running:
            # Its request consumer is down (reconnecting): engines must not count on it.
            LOG.debug("Worker %s is not serving; discovery not answered", self.worker_id)
            return
        reply_to = message.properties.get("reply_to")
        if not reply_to:
            LOG.warning("NOTIFY %s has no reply_to; not answered", dp.describe(message))
            return
        self._submit_control(self._reply_notify, reply_to)

    def _reply_notify(self, reply_to: str) -> None:
        notify = pr.Notify(topic=self._topic, tasks=self.task_names)
        try:
            # As _send, with the versions beside the (TaskFlow-shaped) body.
            self._proxy.publish(notify, reply_to, headers=self._notify_headers(),
                                declare_queue=False)
        except Exception as err:
            LOG.error("Worker %s could not answer NOTIFY of %r: %s", self.worker_id, reply_to, err)

    def _on_cancel(self, data: Any, message: Delivery) -> None:
        # Only requests still queued here are affected: _serve checks before it says RUNNING.
        self._revoked.add(data["request_ids"])
        self._async.cancel(data["request_ids"])  # those already awaited stop now
        LOG.info("Worker %s will not run %d revoked request(s) %s", self.worker_id,
                 len(data["request_ids"]), dp.describe(message))

    def _on_stop(self, data: Any, message: Delivery) -> None:
        # Their flow is being cancelled (see running_calls): one still queued here is dropped
        # unrun when it comes, as for a CANCEL; one running is told, through its context.
        self._revoked.add(data["request_ids"])
        self._calls.stop(data["request_ids"], data["reason"])

    def _interrupt(self, request_id: str, _reason: str) -> None:
        self._async.interrupt([request_id])  # an awaited task: at its next await

    def _on_refused(self, message: Delivery, reason: str, detail: str) -> None:
        """Tell the sender of a refused REQUEST why, when it says where to reply."""
        props = message.properties or {}
        reply_to, correlation_id = props.get("reply_to"), props.get("correlation_id")
        # Anything but discovery that names where to reply (a REQUEST, or a message of an
        # unknown or missing type) is answered, so its sender need not wait for a timeout.
        if props.get("type") == pr.NOTIFY or not reply_to or not correlation_id:
            return
        if reason in sg.REASONS:
            return  # an answer would lend the worker's signature to whoever forged it
        error = exc.InvalidFormat(
            f"Worker {self.worker_id} (topic '{self._topic}') refused the request: "
            f"reason={reason} {detail}")
        self._reply(reply_to, str(correlation_id), message.headers or {}, pr.FAILURE,
                    f"(refused, reason={reason})",
                    result=pr.failure_to_dict(Failure.from_exception(error)))

    def _on_request(self, data: Any, message: Delivery) -> None:
        props = message.properties
        if not props.get("reply_to") or not props.get("correlation_id"):
            LOG.warning(
                "Rejected message %s: reason=missing-reply-to REQUEST lacks reply_to or "
                "correlation_id", dp.describe(message)
            )
            message.reject()
            return
        with self._busy_lock:
            self._busy += 1
        self._events.emit("task-received", **event_fields(data, message), worker=self.worker_id)
        # One line per task received and finished, as Celery workers log them.
        LOG.info("Task %s[%s] received", clip(data.get("task_name")),
                 clip(props["correlation_id"]))
        try:
            future = self._async.pick(self._endpoints, data, self._executor).submit(
                self._process_request, data, message)
        except RuntimeError:  # executor shut down: let another worker have it
            self._done()
            self._say_returned(message)
            message.requeue()
            return
        future.add_done_callback(functools.partial(self._not_run, message))

    def _say_returned(self, message: Delivery) -> None:
        """Tell the engine of a request given back to the broker unstarted that it was (its
        hand-back by the worker that takes it next then costs no attempt); for engines that
        take a short task's outcome alone (protocol 2), which cannot tell otherwise."""
        props, headers = message.properties, message.headers or {}
        if (message.type != pr.REQUEST or not quiet_start(headers)
                or not props.get("reply_to") or not props.get("correlation_id")):
            return
        try:
            # Confirmed before the request goes back: the hand-back cannot overtake it.
            self._forward_event(props, headers, ext.EVENT_RETURNED, {"worker": self.worker_id},
                                retry=False)
        except Exception as err:  # then its hand-back counts as an attempt: no worse
            LOG.debug("Could not tell the engine that request %s goes back unstarted: %s",
                      dp.describe(message), err)

    def _not_run(self, message: Delivery, future: Any) -> None:
        """Say so when the executor could not run a request at all (it never raises on its
        own: _process_request settles every request): drop it rather than wedge silently."""
        error = None if future.cancelled() else future.exception()
        if error is None or message.acknowledged:
            return
        self._done()  # the slot is free before anyone reads the log line
        message.reject()
        LOG.error("Rejected message %s: reason=executor-failed worker %s could not run it on "
                  "its executor %s: %s: %s", dp.describe(message), self.worker_id,
                  type(self._executor).__name__, type(error).__name__, clip(str(error)))

    def _done(self) -> None:
        with self._busy_lock:
            self._busy -= 1

    def _process_request(self, data: Mapping[str, Any], message: Delivery) -> None:
        try:
            headers = message.headers or {}
            request_id = headers.get(pr.HEADER_REQUEST_ID)
            attempt = headers.get(pr.HEADER_ATTEMPT)
            with self.hooks.serving(
                headers, task_name=str(data.get("task_name")), worker=self.worker_id,
                request_id=request_id if isinstance(request_id, str) else None,
                attempt=attempt if type(attempt) is int else None, topic=self._topic,
            ):  # fmt: skip
                published = self._serve(data, message)
        except Exception:  # a bug must not leave the request unsettled
            LOG.exception("Serving request %s failed", dp.describe(message))
            published = False
        if published is not ar.LATER:  # else the async runner settles it when it is done
            self._settle(message, bool(published))

    def _take_slots(self, work: pr.WorkUnit, message: Delivery, reply: Callable[..., bool],
                    name: str) -> Any:
        """Hold the request's limit slots (waiting unstarted): :data:`_HELD` (or
        :data:`_HELD_AFTER_WAIT` if it had to wait) once held, else what :meth:`_serve`
        returns: it was revoked meanwhile, or the worker is stopping."""
        assert self._limits is not None
        props, headers = message.properties, message.headers or {}
        revoked: list[bool] = []
        waited: list[bool] = []

        def still_waiting(waiting_for: dict[str, Any]) -> None:
            waited.append(bool(waiting_for))
            try:
                self._forward_event(props, headers, task_mod.EVENT_UPDATE_PROGRESS,
                                    lm.waiting_event(waiting_for), retry=False)
            except Exception as err:  # the next one may get through
                LOG.debug("Could not tell the engine of %s it waits: %s", name, err)

        request_id = props["correlation_id"]

        def give_up() -> bool:
            if self._revoked.take(request_id):
                revoked.append(True)
                return True
            return not self._proxy.is_running

        slots = self._limits.take(work.task_cls, work.task_name, heartbeat_interval(headers),
                                  still_waiting, give_up)
        if slots is None:
            if revoked:
                LOG.info("Not running request %s for task %s: its engine revoked it while it "
                         "waited for a limit", dp.describe(message), name)
                return reply(pr.EVENT, name, event_type=cn.EVENT_CANCELLED,
                             details={"worker": self.worker_id})
            self._say_returned(message)
            return False  # stopping: handed back unstarted
        self._slots[id(message)] = slots
        if waited:
            still_waiting({})  # it no longer waits
            return _HELD_AFTER_WAIT
        return _HELD

    def _settle(self, message: Delivery, published: bool) -> None:
        slots = self._slots.pop(id(message), None)
        if slots is not None and self._limits is not None:
            self._limits.release(slots)
        self._done()
        if published:
            message.ack()
        else:
            message.requeue()

    def _catch_up_on_control(self, name: str) -> None:
        """Let the control consumer read what waits for it before a request starts, when it
        has fallen behind.

        A request taken before the process froze (SIGSTOP, a paused VM) may have been
        revoked meanwhile (a resumed engine sent it again elsewhere). Its CANCEL waits on the
        control queue, which another thread reads; after the thaw the request's thread would
        otherwise check for revocations first and run it. A control consumer that found its
        queue empty within :data:`CONTROL_LAG` has read everything sent before then, and costs
        nothing here.
        """
        control = self._control_proxy
        if control is None or not control.is_running:
            return
        now = time.monotonic()
        if now - control.idle_at <= CONTROL_LAG:
            return
        if not control.wait_idle_after(now, CONTROL_CATCH_UP):
            LOG.warning("Starting request for task %s before reading the control queue "
                        "(cancellations) to its end: still behind after %.0fs", name,
                        CONTROL_CATCH_UP)

    def _serve(self, data: Mapping[str, Any], message: Delivery) -> Any:
        """Run one request; True once its outcome is published (:data:`~.async_runner.LATER`:
        an ``async def`` now awaited, settled by :meth:`_async_done`)."""
        props, headers = message.properties, message.headers or {}
        reply = functools.partial(self._reply, props["reply_to"], props["correlation_id"], headers)
        # Names come from the message: bounded, so a hostile one cannot flood logs or replies.
        name = f"{clip(data.get('task_name'))!r} ({clip(data.get('task_cls'))})"
        # The engine names the secret arguments (its task's secret_args may not be all).
        secrets = sa.masker(data.get("arguments"), sa.names(headers))
        deadline = headers.get(pr.HEADER_DEADLINE)
        if isinstance(deadline, (int, float)) and time.time() > deadline:
            err = exc.RequestTimeout(f"Request for task {name} reached its deadline unstarted")
            return reply(pr.FAILURE, name, result=pr.failure_to_dict(Failure.from_exception(err)))
        self._catch_up_on_control(name)
        if self._revoked.take(props["correlation_id"]):  # a flowengine attempt's request id
            # Its engine suspended (or gave up) while it waited here: it must not run unseen.
            LOG.info("Not running request %s for task %s: its engine revoked it",
                     dp.describe(message), name)
            return reply(pr.EVENT, name, event_type=cn.EVENT_CANCELLED,
                         details={"worker": self.worker_id})
        if message.redelivered and from_flowengine(headers):
            # Its previous holder died or was cut off, perhaps killed by this very request. A
            # flowengine engine counts attempts and decides whether to try again; a TaskFlow
            # engine cannot, so its requests keep running on redelivery.
            LOG.warning("Handing back request %s for task %s to its engine: the broker"
                        " redelivered it", dp.describe(message), name)
            return reply(pr.EVENT, name, event_type=ext.EVENT_REDELIVERED,
                         details={"worker": self.worker_id})
        if self._run_requests is not None and not self._run_requests.claim(headers):
            # A copy of a signed request that ran already (pushed back, not redelivered):
            # unanswered, since its engine has what it needs, and an answer to a copy of a
            # request still running would tell its engine the request came back.
            LOG.warning("Rejected message %s: reason=%s task %s: this signed request ran "
                        "already", dp.describe(message), rp.REASON_REPLAYED, name)
            return True
        try:
            work = pr.Request.from_dict(data)
            endpoint = self._endpoints.get(work.task_cls)
            if endpoint is None:
                raise exc.NotFound(
                    f"Task class '{clip(work.task_cls)}' is not one of the"
                    f" {len(self._endpoints)} task classes worker {self.worker_id} (topic"
                    f" '{self._topic}') runs"
                )
            task = endpoint.generate(name=work.task_name)
            if vs.major(work.task_version) != vs.major(task.version):
                raise exc.IncompatibleVersion(
                    f"Task {name} version {work.task_version} was requested; worker"
                    f" {self.worker_id} runs version {list(task.version)}"
                )
        except Exception as err:
            reason = ("unknown-task" if isinstance(err, exc.NotFound) else "other-version"
                      if isinstance(err, exc.IncompatibleVersion) else "unusable-request")
            if (reason in ("unknown-task", "other-version") and self._control_proxy is not None
                    and from_flowengine(headers)):
                # A worker sharing this topic runs it (a rolling deploy): the engine resends it.
                LOG.info("Handing back request %s for task %s: not served by this worker%s",
                         dp.describe(message), name,
                         f" ({err})" if reason == "other-version" else "")
                details: dict[str, Any] = {"worker": self.worker_id}
                if reason == "other-version":
                    details["version"] = vs.text(task.version)
                return reply(pr.EVENT, name, event_type=ext.EVENT_NOT_SERVED, details=details)
            LOG.warning("Rejected message %s: reason=%s task %s: %s", dp.describe(message),
                        reason, name, clip(secrets.text(str(err))))
            failure = Failure()
            return reply(pr.FAILURE, name, result=pr.failure_to_dict(
                failure.redacted(secrets) if secrets else failure))
        # An engine of protocol 2 takes a short task's outcome as its only reply: RUNNING is
        # said only once the task outlives a short threshold (by the heartbeat thread). Not
        # after a wait for a limit: its engine was told it waits, and must hear it started.
        # Nor for a task this worker has not seen end that soon: a worker that freezes or dies
        # while running it must leave its engine a lease to see lapse, which a RUNNING reply
        # sent later would never have started.
        runs_key = (work.task_cls, work.action)
        quiet = (self._control_proxy is not None and quiet_start(headers)
                 and self._short_runs.known_short(runs_key))
        if self._limits is not None:
            held = self._take_slots(work, message, reply, name)
            if held is _HELD_AFTER_WAIT:
                quiet = False
            elif held is not _HELD:
                return held
        if not quiet and not reply(pr.RUNNING, name):
            return False
        secrets = sa.masker(work.arguments, sa.names(headers), task)
        fields = dict(event_fields(data, message), worker=self.worker_id)
        self._events.emit("task-started", **fields)
        started = time.monotonic()
        forward = functools.partial(self._forward_event, props, headers)
        interval = heartbeat_interval(headers)
        beating = object()  # delivery tags repeat across reconnects; this key cannot
        if quiet or interval is not None:
            # The engine's lease on this attempt lasts only as long as heartbeats keep coming.
            # A late heartbeat is harmless; progress (forward) must precede the outcome.
            heartbeat = None if interval is None else functools.partial(
                self._forward_event, props, headers, ext.EVENT_HEARTBEAT, {},
                confirm=not from_flowengine(headers), retry=False)
            pulse = _Pulse(functools.partial(reply, pr.RUNNING, name) if quiet else None,
                           heartbeat)
            self._heartbeats.add(beating, interval, functools.partial(self._beat, pulse, message),
                                 first=running_after(headers, interval) if quiet else None)
        conclude = functools.partial(self._conclude, data, props, fields, started, reply, name,
                                     secrets, runs_key)
        request_id = props["correlation_id"]
        # The task's context (flowengine.context), with a signal a STOP for it sets.
        ctx = rn.context_from(headers, data, request_id, self.worker_id,
                              self._calls.start(request_id))
        if endpoint.awaits(work.action):
            lane = self._async.lane()
            try:
                self._async.start(
                    request_id, work.task_name,
                    _masked_call(secrets, _in_context(
                        ctx, ar.call(endpoint, task, work, lane, forward))),
                    time_limit(headers), lane,
                    functools.partial(self._async_done, message, beating, conclude, reply, name,
                                      request_id))
            except Exception:
                self._heartbeats.remove(beating)
                self._calls.end(request_id)
                raise
            # Once the runner has it: a STOP that came meanwhile interrupts it now.
            ctx.signal.on_request(functools.partial(self._interrupt, request_id))
            return ar.LATER
        try:
            # Whatever the task logs meanwhile is masked.
            with sa.masking(secrets), context.bound(ctx):
                if work.action == pr.EXECUTE:
                    result = endpoint.execute(task, work.arguments, forward)
                else:
                    prior = None if work.result is pr.NO_RESULT else work.result
                    result = endpoint.revert(task, work.arguments, prior, work.failures, forward)
        finally:
            self._heartbeats.remove(beating)
            self._calls.end(request_id)
        return conclude(result)

    def _conclude(self, data: Mapping[str, Any], props: Mapping[str, Any],
                  fields: dict[str, Any], started: float, reply: Callable[..., bool], name: str,
                  secrets: Any, runs_key: tuple[str, str], result: Any) -> bool:
        """Log, announce and publish a finished request's outcome; True once published."""
        if isinstance(result, Failure) and secrets:
            result = result.redacted(secrets)  # before it is logged, evented or sent
        runtime = time.monotonic() - started
        self._short_runs.ran(runs_key, runtime)
        # Neither the result nor the exception's text: either may hold a secret.
        LOG.info("Task %s[%s] %s in %.3fs", clip(data.get("task_name")),
                 clip(props["correlation_id"]),
                 f"failed ({first(result)})" if isinstance(result, Failure) else "succeeded",
                 runtime)
        if isinstance(result, Failure):
            self._events.emit("task-failed", **fields, runtime=runtime,
                              exception=result.exception_str, exc_type=first(result))
            return reply(pr.FAILURE, name, result=pr.failure_to_dict(result))
        self._events.emit("task-succeeded", **fields, runtime=runtime)
        return reply(pr.SUCCESS, name, result=result)

    def _async_done(self, message: Delivery, beating: object, conclude: Callable[[Any], bool],
                    reply: Callable[..., bool], name: str, request_id: str,
                    outcome: Any) -> None:
        """An awaited request ended (on its lane): answer it and settle its message."""
        self._heartbeats.remove(beating)
        self._calls.end(request_id)
        try:
            if outcome is ar.CANCELLED:
                LOG.info("Cancelled task %s %s: its engine revoked it", name, dp.describe(message))
                published = reply(pr.EVENT, name, event_type=cn.EVENT_CANCELLED,
                                  details={"worker": self.worker_id})
            else:
                published = outcome is not ar.ABANDONED and conclude(outcome)
        except Exception:
            LOG.exception("Serving request %s failed", dp.describe(message))
            published = False
        self._settle(message, published)

    def _beat(self, heartbeat: Callable[[], None], message: Delivery) -> None:
        # The broker's own lease first (beanstalkd's TTR, renewed by touch), then the engine's.
        try:
            message.touch()
        finally:
            heartbeat()

    def start(self) -> None:
        """Serve until :meth:`stop` (blocks); then announce going offline.

        The announcement waits until in-flight requests are settled (or the stop's grace is
        over), because engines re-dispatch whatever an offline worker still holds.
        """
        if self._control_proxy is not None:
            self._control_thread = threading.Thread(
                target=self._serve_control, daemon=True,
                name=f"flowengine-control-{self.worker_id}")
            self._control_thread.start()
        try:
            self._proxy.start()
        finally:
            if self._control_proxy is not None:
                self._control_proxy.stop()
                if self._control_thread is not None:
                    self._control_thread.join(timeout=10)
                self._control_proxy.delete_own_queue()
            self._control.shutdown(wait=True)
            self._async.stop()
            if self._online:
                self.announce(pr.WORKER_OFFLINE)

    def _serve_control(self) -> None:
        assert self._control_proxy is not None
        try:
            self._control_proxy.start()
        except bo.BrokerRefused as err:  # the topic queue's consumer raises it to the caller
            LOG.debug("Worker %s control queue: %s", self.worker_id, err)
        except Exception as err:
            LOG.error("Worker %s stopped reading its control queue: %s", self.worker_id, err)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until serving its topic and its control queue; False on timeout.

        Both: a pause or other control broadcast sent as soon as this returns must find the
        control queue bound (a fanout exchange drops what no queue is bound to receive).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._proxy.wait(timeout):
            return False
        if self._control_proxy is None:
            return True
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self._control_proxy.wait(left)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until :meth:`start` has returned; False on timeout."""
        return self._proxy.wait_stopped(timeout)

    def close(self) -> None:
        """Release the broker connections used for replies (after :meth:`wait_stopped`)."""
        self._proxy.close()

    def stop(self, grace: float = 0.0) -> None:
        """Stop taking requests (returns at once; :meth:`start` returns once they are settled).

        Args:
            grace: Seconds in-flight requests get to publish their outcome and be acknowledged
                before the channel closes (the broker redelivers the rest).
        """
        self._proxy.stop(grace)


#: What :meth:`Server._take_slots` returns once a request holds its limit slots.
_HELD = object()
_HELD_AFTER_WAIT = object()


class _ShortRuns:
    """Which tasks (class and action) last ended on this worker within
    :data:`~flowengine.worker_based.extensions.RUNNING_AFTER`: only those start quietly for a
    protocol-2 engine. One entry per task class the worker runs and action, so it stays small."""

    __slots__ = ("_short",)

    def __init__(self) -> None:
        self._short: dict[tuple[str, str], bool] = {}

    def known_short(self, key: tuple[str, str]) -> bool:
        """Whether ``key``'s last run here ended within the threshold (False if it never ran)."""
        return self._short.get(key, False)

    def ran(self, key: tuple[str, str], seconds: float) -> None:
        """Note that a run of ``key`` took ``seconds``."""
        self._short[key] = seconds < ext.RUNNING_AFTER


class _Pulse:
    """A running request's beats: RUNNING first when it was not said before it started (its
    engine takes a short task's outcome alone), then heartbeats (if its engine asked)."""

    __slots__ = ("_running", "_heartbeat")

    def __init__(self, running: Callable[[], Any] | None,
                 heartbeat: Callable[[], None] | None) -> None:
        self._running, self._heartbeat = running, heartbeat

    def __call__(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            running()
        elif self._heartbeat is not None:
            self._heartbeat()


def _in_context(ctx: context.TaskContext, call: Callable[[], Any]) -> Callable[[], Any]:
    """``call``'s coroutine, awaited with ``ctx`` current (in the asyncio task awaiting it)."""
    async def bound() -> Any:
        with context.bound(ctx):
            return await call()

    return bound


def _masked_call(secrets: Any, call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with the request's secrets masked in whatever its coroutine logs."""
    return lambda: sa.masked(secrets, call())
