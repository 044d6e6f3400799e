"""How a worker runs ``async def execute``/``revert``: awaited on one event loop, not on threads.

A worker whose task classes include ``async def`` methods starts one event loop thread (on the
first such request) and awaits up to ``async_concurrency`` of those calls on it at once, so one
worker process holds many I/O-bound tasks without a thread each. The rest of a request's handling
(the checks, the RUNNING reply, the outcome, the acknowledgement) is the server's, as for any
request; it runs on a few *lane* threads of this runner, never on the loop, because replies are
blocking broker round trips. Each request's messages (progress, then its outcome) leave through
its own :class:`Lane`, in order.

A coroutine ends in one of four ways:

- it returns or raises: its outcome (a result, or a :class:`~flowengine.types.failure.Failure`);
- it runs past its time limit (the request's ``x-flowengine-time-limit`` header): it is
  cancelled and fails with :class:`~flowengine.exceptions.TaskTimeLimitExceeded`, as the engine
  fails a thread task that overruns;
- a CANCEL names its request: it is cancelled and answered with the cancellation event
  (:data:`CANCELLED`), so its engine knows it stopped;
- a STOP names its request (its flow is being cancelled, :mod:`.running_calls`): once its
  call began it is interrupted at its next await and fails with
  :class:`~flowengine.exceptions.FlowCancelled` (unless it catches the cancellation and
  returns), an outcome its engine then reverts; before that, as for a CANCEL;
- the worker stops with it still running: it is cancelled unanswered (:data:`ABANDONED`) and its
  request goes back to the broker, as a thread task's does when the stop grace runs out.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine.engines.event_loop import EventLoopThread
from flowengine.types.failure import Failure
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import endpoint as ep
from flowengine.worker_based import protocol as pr

if TYPE_CHECKING:
    from flowengine.task import Task

LOG = logging.getLogger(__name__)

#: Default most ``async def`` calls one worker awaits at once.
DEFAULT_ASYNC_CONCURRENCY = 1000
#: Threads that handle async requests' messages (checks, RUNNING, progress, outcomes).
LANE_THREADS = 4
#: What :meth:`Server._serve` returns for a request the runner settles later.
LATER = object()
#: The outcome of a coroutine a CANCEL stopped.
CANCELLED = object()
#: The outcome of a coroutine the worker's stop cut short (its request is requeued).
ABANDONED = object()

#: Seconds a CANCEL for a request not started here yet is remembered.
EARLY_CANCEL_TTL = 60.0

Outcome = Any
Done = Callable[[Outcome], None]


def validate_concurrency(value: int | None, topic: str) -> int:
    """``async_concurrency`` as given (None: the default), or ValueError naming the worker."""
    if value is None:
        return DEFAULT_ASYNC_CONCURRENCY
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Worker on topic '{topic}': async_concurrency must be a whole number "
                         f"of at least 1, got {value!r}")
    return value


def serves_async(endpoints: Iterable[ep.Endpoint]) -> bool:
    """Whether any of ``endpoints`` has an ``async def`` execute or revert."""
    return any(endpoint.awaits(action) for endpoint in endpoints
               for action in ("execute", "revert"))


def call(endpoint: ep.Endpoint, task: Task, work: pr.WorkUnit, lane: Lane,
         forward: Callable[[str, Any], None]) -> Callable[[], Awaitable[Any]]:
    """What :meth:`AsyncRunner.start` awaits for ``work``: its execute or revert, whose progress
    leaves through ``lane`` (a publish is a blocking round trip, kept off the loop)."""
    def progress(event_type: str, details: Any) -> None:
        lane.put(functools.partial(forward, event_type, details))

    if work.action == pr.EXECUTE:
        return lambda: endpoint.execute_async(task, work.arguments, progress)
    prior = None if work.result is pr.NO_RESULT else work.result
    return lambda: endpoint.revert_async(task, work.arguments, prior, work.failures, progress)


class Lane:
    """One request's messages, sent in the order they were put, on the runner's lane threads.

    Every :meth:`put` schedules a drain; a drain sends whatever is queued, under the lane's lock,
    so the progress a task reported always leaves before its outcome.
    """

    def __init__(self, pool: cf.Executor) -> None:
        self._pool = pool
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._lock = threading.Lock()

    def put(self, send: Callable[[], None]) -> None:
        """Send ``send()`` after everything put before it."""
        self._queue.append(send)
        self._pool.submit(self._drain)

    def _drain(self) -> None:
        with self._lock:
            while self._queue:
                send = self._queue.popleft()
                try:
                    send()
                except Exception:  # one message failing must not keep the next from leaving
                    LOG.exception("Sending a message of an async task failed")


class _Job:
    __slots__ = ("call", "done", "interrupted", "lane", "limit", "name", "request_id",
                 "revoked", "started", "task")

    def __init__(self, request_id: str, name: str, call: Callable[[], Awaitable[Any]],
                 limit: float | None, lane: Lane, done: Done) -> None:
        self.request_id, self.name, self.call, self.limit = request_id, name, call, limit
        self.lane, self.done = lane, done
        self.revoked = False
        self.interrupted = False
        self.started = False  # its call began (it has a slot)
        self.task: asyncio.Task[Any] | None = None


class AsyncRunner:
    """A worker's event loop for ``async def`` task methods, and the threads around it.

    Args:
        concurrency: Most coroutines awaited at once; more wait for a slot.
    """

    def __init__(self, concurrency: int = DEFAULT_ASYNC_CONCURRENCY) -> None:
        self.concurrency = concurrency
        self._lock = threading.Lock()
        self._loop: EventLoopThread | None = None
        self._slots: asyncio.Semaphore | None = None
        self._lanes: cf.ThreadPoolExecutor | None = None
        self._jobs: dict[str, _Job] = {}
        # CANCELs that came before their request got here (between its RUNNING reply and start).
        self._early = cn.Revoked(ttl=EARLY_CANCEL_TTL)

    @property
    def lanes(self) -> cf.Executor:
        """The threads that handle async requests around their coroutines (started on use)."""
        with self._lock:
            if self._lanes is None:
                self._lanes = cf.ThreadPoolExecutor(LANE_THREADS,
                                                    thread_name_prefix="flowengine-async-lane")
            return self._lanes

    def pick(self, endpoints: Mapping[str, ep.Endpoint], data: Mapping[str, Any],
             threads: cf.Executor) -> cf.Executor:
        """Where a REQUEST is handled: the lanes when it calls an ``async def``, else ``threads``.

        Anything odd about the request (unknown class, bad action) goes to ``threads``, where
        the server answers it as it answers any bad request.
        """
        endpoint = endpoints.get(data.get("task_cls"))  # type: ignore[arg-type]
        action = data.get("action")
        if endpoint is not None and isinstance(action, str) and endpoint.awaits(action):
            return self.lanes
        return threads

    @property
    def running(self) -> int:
        """Async calls taken and not finished (waiting for a slot or awaited)."""
        with self._lock:
            return len(self._jobs)

    def lane(self) -> Lane:
        """A new lane for one request's messages."""
        return Lane(self.lanes)

    def start(self, request_id: str, name: str, call: Callable[[], Awaitable[Any]],
              limit: float | None, lane: Lane, done: Done) -> None:
        """Await ``call()`` on the loop; ``done(outcome)`` is then put on ``lane``.

        Args:
            request_id: The request's id, which a CANCEL names.
            name: The task's name, for the time-limit failure.
            call: Gives the coroutine; it returns the outcome (a raised exception is its
                :class:`Failure` already).
            limit: Seconds it may run, counted from when it gets a slot (None: no limit).
            lane: Where the request's messages go, in order.
            done: Gets the outcome, :data:`CANCELLED` or :data:`ABANDONED`.
        """
        job = _Job(request_id, name, call, limit, lane, done)
        job.revoked = self._early.take(request_id)
        with self._lock:
            if self._loop is None:
                self._loop = EventLoopThread(self.concurrency)
            self._jobs[request_id] = job
            loop = self._loop.loop
        asyncio.run_coroutine_threadsafe(self._run(job), loop)

    async def _run(self, job: _Job) -> None:
        job.task = asyncio.current_task()
        outcome: Outcome = ABANDONED
        try:
            if job.revoked or job.interrupted:  # cancelled before it was even scheduled
                raise asyncio.CancelledError
            if self._slots is None:  # made on the loop's own thread, which alone touches it
                self._slots = asyncio.Semaphore(self.concurrency)
            async with self._slots:
                job.started = True
                started = time.monotonic()
                try:
                    async with asyncio.timeout(job.limit) as limit:
                        outcome = await job.call()
                    late = limit.expired()
                except TimeoutError:
                    late = True
                if late:
                    # Past its limit, even when the coroutine caught the cancel and returned
                    # (or failed in its cleanup): the limit's failure stands, as on a local
                    # engine, and nothing it returned late is sent.
                    error = exc.TaskTimeLimitExceeded(job.name, job.limit or 0.0,
                                                      elapsed=time.monotonic() - started)
                    LOG.warning("%s; its coroutine was cancelled", error)
                    outcome = Failure.from_exception(error)
        except asyncio.CancelledError as err:
            if job.interrupted and job.started:
                # Its work began: the outcome is answered, and its engine reverts it.
                outcome = Failure.from_exception(exc.FlowCancelled(
                    f"Task {job.name!r} was interrupted at an await: its flow is being "
                    f"cancelled", cause=err))
            elif job.revoked or job.interrupted:
                outcome = CANCELLED
            else:
                outcome = ABANDONED
        finally:
            with self._lock:
                self._jobs.pop(job.request_id, None)
            job.lane.put(lambda: job.done(outcome))

    def cancel(self, request_ids: Iterable[str]) -> list[str]:
        """Cancel the coroutines of these requests (waiting for a slot or running); the ids of
        those there were."""
        found = []
        with self._lock:
            request_ids = list(request_ids)
            jobs = [self._jobs[rid] for rid in request_ids if rid in self._jobs]
            self._early.add(rid for rid in request_ids if rid not in self._jobs)
            loop = self._loop.loop if self._loop is not None and jobs else None
        for job in jobs:
            job.revoked = True  # before reading job.task: see _run, which sets it first
            task = job.task
            if task is not None and loop is not None:
                loop.call_soon_threadsafe(task.cancel)
            found.append(job.request_id)
        return found

    def interrupt(self, request_ids: Iterable[str]) -> list[str]:
        """Interrupt the coroutines of these requests (a STOP: their flow is being cancelled):
        one whose call began ends with its outcome (a failure, unless it returns anyway), one
        still waiting for a slot as if revoked. The ids of those there were."""
        with self._lock:
            jobs = [self._jobs[rid] for rid in request_ids if rid in self._jobs]
            loop = self._loop.loop if self._loop is not None and jobs else None
        for job in jobs:
            job.interrupted = True  # before reading job.task, as in cancel
            task = job.task
            if task is not None and loop is not None:
                loop.call_soon_threadsafe(task.cancel)
        return [job.request_id for job in jobs]

    def stop(self) -> None:
        """Cancel what still runs (its requests go back to the broker) and end the threads."""
        with self._lock:
            loop, self._loop = self._loop, None
            lanes = self._lanes
        if loop is not None:
            loop.stop()  # the cancelled coroutines put their ABANDONED outcome on their lanes
        self._slots = None  # it belonged to that loop
        if lanes is not None:
            lanes.shutdown(wait=True)
