"""Task executors: where a task's ``execute``/``revert`` actually run.

An executor returns a future whose result is ``(EXECUTED, result)`` or ``(REVERTED, result)``;
a raised exception comes back as a :class:`~flowengine.types.failure.Failure` result, never as
the future's exception. The worker-based engine supplies its own executor with the same API.

The local executors also bound calls by their time limits (:mod:`.time_limits`) and await
``async def`` methods on an event loop of their own (:mod:`.event_loop`).
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import futurist

from flowengine import context, states
from flowengine import exceptions as exc
from flowengine.atom import REVERT_FLOW_FAILURES, REVERT_RESULT, Atom
from flowengine.engines import interception
from flowengine.engines.event_loop import SHUTDOWN_GRACE, EventLoopThread
from flowengine.engines.time_limits import Clock, Watchdog, limit_for, parse_time_limits, settle
from flowengine.hooks import Hooks
from flowengine.task import EVENT_UPDATE_PROGRESS, Task
from flowengine.types.failure import Failure

LOG = logging.getLogger(__name__)

EXECUTED = "executed"
REVERTED = "reverted"
#: A :class:`Work`'s actions (the atom intentions that start them).
EXECUTE = states.EXECUTE
REVERT = states.REVERT

ProgressCallback = Callable[..., None]


def _secret_values(task: Atom, arguments: Mapping[str, Any]) -> list[Any]:
    """The values of the arguments ``task`` marks secret (``secret_args``)."""
    return [arguments[name] for name in task.secret_args
            if arguments.get(name) not in (None, "")]


def _redact(task: Task, arguments: Mapping[str, Any], outcome: Any) -> Any:
    """Mask secret argument values in a failure before anything stores, logs or sends it."""
    if isinstance(outcome, Failure):
        secrets = _secret_values(task, arguments)
        if secrets:
            return outcome.redacted(secrets)
    return outcome


@contextlib.contextmanager
def _hooked(task: Task, post: Callable[[], Any],
            progress_callback: ProgressCallback | None) -> Iterator[list[Any]]:
    """Around a call: progress forwarded, ``post`` after it; an exception becomes a Failure.

    The body puts the call's outcome in the yielded one-item list.
    """
    registered = _listen(task, progress_callback)
    box: list[Any] = [None]
    try:
        try:
            yield box
        except Exception:
            box[0] = Failure()
        finally:
            try:
                post()
            except Exception:
                box[0] = Failure()
    finally:
        _unlisten(task, progress_callback, registered)


def _run(task: Task, pre: Callable[[], Any], call: Callable[[], Any], post: Callable[[], Any],
         progress_callback: ProgressCallback | None) -> Any:
    """Run ``pre``, ``call``, ``post`` with progress forwarded; an exception becomes a Failure."""
    with _hooked(task, post, progress_callback) as box:
        pre()
        box[0] = call()
        if inspect.iscoroutine(box[0]):
            box[0].close()
            raise TypeError(
                f"Task {task.name!r} returned a coroutine; declare it async def (so the "
                f"engine awaits it) or return a value")
    return box[0]


async def _run_async(task: Task, pre: Callable[[], Any], call: Callable[[], Awaitable[Any]],
                     post: Callable[[], Any], progress_callback: ProgressCallback | None) -> Any:
    """:func:`_run` for an ``async def`` method: ``call()`` is awaited."""
    with _hooked(task, post, progress_callback) as box:
        pre()
        box[0] = await call()
    return box[0]


def _revert_kwargs(arguments: Mapping[str, Any], result: Any,
                   failures: Mapping[str, Failure]) -> dict[str, Any]:
    kwargs = dict(arguments)
    kwargs[REVERT_RESULT] = result
    kwargs[REVERT_FLOW_FAILURES] = failures
    return kwargs


#: The hooks a local call is made within (see :meth:`flowengine.hooks.Hooks.call`).
_NO_HOOKS = Hooks()


def execute_task(
    task: Task, arguments: Mapping[str, Any], progress_callback: ProgressCallback | None = None,
    hooks: Hooks = _NO_HOOKS,
) -> tuple[str, Any]:
    """Run ``pre_execute``/``execute``/``post_execute`` here and now, within ``hooks``."""
    with hooks.call(task):
        result = _run(task, task.pre_execute,
                      interception.bound(task, interception.EXECUTE, arguments, task.execute),
                      task.post_execute, progress_callback)
    return EXECUTED, _redact(task, arguments, result)


def revert_task(
    task: Task,
    arguments: Mapping[str, Any],
    result: Any,
    failures: Mapping[str, Failure],
    progress_callback: ProgressCallback | None = None,
    hooks: Hooks = _NO_HOOKS,
) -> tuple[str, Any]:
    """Run ``pre_revert``/``revert``/``post_revert`` here and now, within ``hooks``."""
    kwargs = _revert_kwargs(arguments, result, failures)
    with hooks.call(task):
        outcome = _run(task, task.pre_revert,
                       interception.bound(task, interception.REVERT, kwargs, task.revert),
                       task.post_revert, progress_callback)
    return REVERTED, _redact(task, arguments, outcome)


async def execute_task_async(
    task: Task, arguments: Mapping[str, Any], progress_callback: ProgressCallback | None = None,
    hooks: Hooks = _NO_HOOKS,
) -> tuple[str, Any]:
    """:func:`execute_task` for a task whose ``execute`` is ``async def``."""
    with hooks.call(task):
        result = await _run_async(
            task, task.pre_execute,
            interception.bound_async(task, interception.EXECUTE, arguments, task.execute),
            task.post_execute, progress_callback)
    return EXECUTED, _redact(task, arguments, result)


async def revert_task_async(
    task: Task,
    arguments: Mapping[str, Any],
    result: Any,
    failures: Mapping[str, Failure],
    progress_callback: ProgressCallback | None = None,
    hooks: Hooks = _NO_HOOKS,
) -> tuple[str, Any]:
    """:func:`revert_task` for a task whose ``revert`` is ``async def``."""
    kwargs = _revert_kwargs(arguments, result, failures)
    with hooks.call(task):
        outcome = await _run_async(
            task, task.pre_revert,
            interception.bound_async(task, interception.REVERT, kwargs, task.revert),
            task.post_revert, progress_callback)
    return REVERTED, _redact(task, arguments, outcome)


def is_async(method: Any) -> bool:
    """Whether ``method`` is an ``async def`` (its call returns a coroutine to await)."""
    return inspect.iscoroutinefunction(method)


def async_methods(task: Atom) -> list[str]:
    """Names of ``task``'s methods an engine must await (``execute``, ``revert``)."""
    own = getattr(task, "__dict__", None)
    if own is None or "execute" in own or "revert" in own:  # methods set on the instance
        return _async_methods(task)
    # Every engine checks every atom as it compiles (a process may compile one flow per
    # request): what a class's methods are is worked out once per class.
    cls = type(task)
    methods = _ASYNC_METHODS.get(cls)
    if methods is None:
        methods = _ASYNC_METHODS[cls] = tuple(_async_methods(task))
    return list(methods)


def _async_methods(task: Atom) -> list[str]:
    return [name for name in ("execute", "revert") if is_async(getattr(task, name, None))]


#: :func:`async_methods` of each class (weakly keyed: classes made at run time can go).
_ASYNC_METHODS: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _listen(task: Task, callback: ProgressCallback | None) -> bool:
    if callback is None:
        return False
    task.notifier.register(EVENT_UPDATE_PROGRESS, callback)
    return True


def _unlisten(task: Task, callback: ProgressCallback | None, registered: bool) -> None:
    if registered and callback is not None:
        task.notifier.deregister(EVENT_UPDATE_PROGRESS, callback)


@dataclasses.dataclass(frozen=True)
class Work:
    """One call an engine hands its executor: a task's ``execute`` or ``revert``.

    Engines hand every call over as one of these (:meth:`TaskExecutor.submit`); TaskFlow's
    ``execute_task``/``revert_task`` remain as faces that build one.

    Args:
        task: The task to call.
        task_uuid: Its atom's uuid in the flow's storage.
        action: :data:`EXECUTE` or :data:`REVERT`.
        arguments: The call's arguments, by name.
        result: For a revert: what ``execute`` returned (or its failure).
        failures: For a revert: the flow's execute failures, by atom name.
        progress_callback: Given the task's progress notifications (None: nobody listens).
        delay: Seconds before the call may start: only for an executor whose
            :attr:`~TaskExecutor.delays_dispatch` is true (the others are never given one;
            the engine waits for them, the task PENDING meanwhile).
        on_delayed_job: Given the broker's handle of a delayed call once it is held there, so
            that a resumed engine can delete it (:meth:`TaskExecutor.delete_at_start`).
    """

    task: Task
    task_uuid: str
    action: str
    arguments: Mapping[str, Any]
    result: Any = None
    failures: Mapping[str, Failure] = dataclasses.field(default_factory=dict)
    progress_callback: ProgressCallback | None = None
    delay: float = 0.0
    on_delayed_job: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if self.action not in (EXECUTE, REVERT):
            raise ValueError(f"Work for task {self.task.name!r} needs action {EXECUTE!r} or "
                             f"{REVERT!r}, not {self.action!r}")
        if self.delay and self.action == REVERT:
            raise ValueError(f"A revert is never delayed (task {self.task.name!r} was given "
                             f"{self.delay} s)")


class TaskExecutor(metaclass=abc.ABCMeta):
    """Runs tasks somewhere and hands back futures of their outcomes.

    Engines hand calls over through :meth:`submit` alone. An executor written against
    TaskFlow's interface implements :meth:`execute_task` and :meth:`revert_task`, which the
    default :meth:`submit` calls; flowengine's own executors implement :meth:`submit`
    (:class:`WorkExecutor`), and their ``execute_task``/``revert_task`` build a :class:`Work`
    for it.
    """

    #: Whether ``async def`` execute/revert methods are awaited here; an engine refuses tasks
    #: with them, before anything runs, when its executor cannot.
    runs_coroutines = False
    #: Whether calls run on the engine's own thread, one at a time (nothing ever waits in a
    #: queue): a cancel then tells the running call at once, from the cancelling thread.
    runs_inline = False
    #: Whether :meth:`submit` takes work with a ``delay``: the executor holds a task's start
    #: delay and its retry controllers' waits where it sends the call (a worker-based
    #: executor: in the broker), so the engine hands the call over at once. Otherwise the
    #: engine waits them out itself and never passes a delay.
    delays_dispatch = False

    def submit(self, work: Work) -> cf.Future:
        """Start ``work``; return a future of ``(EXECUTED, result)`` or
        ``(REVERTED, result)`` (a raised exception is a Failure result, never the future's
        exception).

        This default hands it to :meth:`execute_task` or :meth:`revert_task`.
        """
        if work.action == REVERT:
            return self.revert_task(work.task, work.task_uuid, work.arguments, work.result,
                                    work.failures, progress_callback=work.progress_callback)
        if work.delay > 0 or work.on_delayed_job is not None:
            return self.execute_task(work.task, work.task_uuid, work.arguments,
                                     progress_callback=work.progress_callback, delay=work.delay,
                                     on_delayed_job=work.on_delayed_job)
        return self.execute_task(work.task, work.task_uuid, work.arguments,
                                 progress_callback=work.progress_callback)

    @abc.abstractmethod
    def execute_task(
        self,
        task: Task,
        task_uuid: str,
        arguments: Mapping[str, Any],
        progress_callback: ProgressCallback | None = None,
        delay: float = 0.0,
        on_delayed_job: Callable[[str], None] | None = None,
    ) -> cf.Future:
        """Schedule ``task.execute(**arguments)``.

        Args:
            delay: seconds before the call may start (only given when
                :attr:`delays_dispatch` is true).
            on_delayed_job: given the broker's handle of a delayed call once it is held
                there (so a resumed engine can delete it: :meth:`delete_at_start`).
        """

    @abc.abstractmethod
    def revert_task(
        self,
        task: Task,
        task_uuid: str,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure],
        progress_callback: ProgressCallback | None = None,
    ) -> cf.Future:
        """Schedule ``task.revert(result=..., flow_failures=..., **arguments)``."""

    def start(self) -> None:
        """Prepare to run tasks (called when an engine run starts)."""

    def stop(self) -> None:
        """Release resources (called when an engine run ends)."""

    def stop_executions(self, reason: str) -> None:
        """Take back the executes not started yet and ask those running to stop (their flow
        is being cancelled); the engine then cancels their futures.

        Local calls hear it through their context's signal, which the engine sets, and their
        queued futures' cancel takes them back; an executor whose calls run elsewhere does
        both there.
        """

    def reserve_request_id(self, task_uuid: str) -> str | None:
        """The id the next request for atom ``task_uuid`` will carry, chosen now so the engine
        stores it with the state that starts the action (None: this executor sends no
        requests that could outlive its process)."""
        return None

    def revoke_at_start(self, request_ids: Iterable[str]) -> None:
        """Make sure the requests with these stored ids never run: a process that died left
        them in flight, and this run sends their atoms again (local executors' calls die with
        their process: nothing to do)."""

    def delete_at_start(self, jobs: Iterable[str]) -> None:
        """Delete the delayed calls a dead process left held by the broker (their handles,
        as ``on_delayed_job`` gave them); this run sends their atoms again."""


class WorkExecutor(TaskExecutor):
    """An executor that implements :meth:`submit`; TaskFlow's ``execute_task`` and
    ``revert_task`` are its faces, each building a :class:`Work` (flowengine's local and
    worker-based executors)."""

    @abc.abstractmethod
    def submit(self, work: Work) -> cf.Future:
        """Start ``work`` (see :meth:`TaskExecutor.submit`)."""

    def execute_task(
        self,
        task: Task,
        task_uuid: str,
        arguments: Mapping[str, Any],
        progress_callback: ProgressCallback | None = None,
        delay: float = 0.0,
        on_delayed_job: Callable[[str], None] | None = None,
    ) -> cf.Future:
        """TaskFlow's face of :meth:`submit` for an execute."""
        return self.submit(Work(task, task_uuid, EXECUTE, arguments,
                                progress_callback=progress_callback, delay=delay,
                                on_delayed_job=on_delayed_job))

    def revert_task(
        self,
        task: Task,
        task_uuid: str,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure],
        progress_callback: ProgressCallback | None = None,
    ) -> cf.Future:
        """TaskFlow's face of :meth:`submit` for a revert."""
        return self.submit(Work(task, task_uuid, REVERT, arguments, result, failures,
                                progress_callback=progress_callback))


def _done_future(value: Any) -> cf.Future:
    future: cf.Future = cf.Future()
    future.set_result(value)
    return future


class LocalTaskExecutor(WorkExecutor):
    """What the serial and parallel executors share: time limits and awaiting coroutines.

    Args:
        time_limits: ``{task name: seconds}`` overriding tasks' ``time_limit``.
        max_async_tasks: ``async def`` calls awaited at the same time (on one loop thread).
        clock: monotonic clock of the time limits (tests inject one).
        hooks: What each call is made within (its engine's hooks; None: nothing).
    """

    runs_coroutines = True

    def __init__(self, time_limits: Mapping[str, float] | None = None,
                 max_async_tasks: int | None = None, clock: Clock = time.monotonic,
                 hooks: Hooks | None = None) -> None:
        self._hooks = hooks if hooks is not None else _NO_HOOKS
        if max_async_tasks is not None and max_async_tasks < 1:
            raise ValueError(f"max_async_tasks must be at least 1, got {max_async_tasks}")
        self._limits = parse_time_limits(time_limits)
        self._max_async = max_async_tasks or DEFAULT_MAX_ASYNC_TASKS
        self._clock = clock
        self._watchdog = Watchdog(clock)
        self._loop: EventLoopThread | None = None
        self._loop_lock = threading.Lock()

    @property
    def watchdog(self) -> Watchdog:
        """Fails calls past their time limit (tests call its ``check`` after moving the clock)."""
        return self._watchdog

    def start(self) -> None:
        self._watchdog = Watchdog(self._clock)

    def stop(self) -> None:
        self._watchdog.stop()
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()

    def _event_loop(self) -> EventLoopThread:
        with self._loop_lock:
            if self._loop is None:
                self._loop = EventLoopThread(self._max_async)
            return self._loop

    def _dispatch(self, task: Task, outcome: str, method: Any, call: Callable[[], Any],
                  coroutine: Callable[[], Awaitable[Any]]) -> cf.Future:
        limit = limit_for(task, self._limits)
        # The engine made the call's context current around this hand-over: it must be current
        # where the call runs (a pool thread, a helper thread, an asyncio task) too.
        if is_async(method):
            ctx = context.active()
            return self._awaited(task, outcome, _coroutine_in(ctx, coroutine), limit, ctx)
        binding = context.carried()
        if binding is not None and not (self.runs_inline and limit is None):
            call = functools.partial(_call_in, binding, call)  # it runs on another thread
        if limit is None:
            return self._plain(call)
        return self._bounded(task, outcome, call, limit)

    @abc.abstractmethod
    def _plain(self, call: Callable[[], Any]) -> cf.Future:
        """Run a call that has no time limit."""

    @abc.abstractmethod
    def _bounded(self, task: Task, outcome: str, call: Callable[[], Any],
                 limit: float) -> cf.Future:
        """Run a call the watchdog fails after ``limit`` seconds."""

    def _timed(self, future: cf.Future, task: Task, outcome: str, call: Callable[[], Any],
               limit: float) -> None:
        """Run ``call`` under the watchdog, settling ``future`` (unless cancelled first)."""
        if not future.set_running_or_notify_cancel():
            return
        self._watchdog.started(future, task.name, outcome, limit)
        try:
            value = call()
        finally:
            self._watchdog.finished(future)
        settle(future, value, task.name)

    def _awaited(self, task: Task, outcome: str, coroutine: Callable[[], Awaitable[Any]],
                 limit: float | None, ctx: context.TaskContext | None) -> cf.Future:
        future: cf.Future = cf.Future()
        loop = self._event_loop()
        loop.submit(self._await(future, task, outcome, coroutine, limit, loop.loop, ctx))
        return future

    async def _await(self, future: cf.Future, task: Task, outcome: str,
                     coroutine: Callable[[], Awaitable[Any]], limit: float | None,
                     loop: asyncio.AbstractEventLoop, ctx: context.TaskContext | None) -> None:
        if not future.set_running_or_notify_cancel():
            return  # cancelled (a suspension) while it waited for a slot
        running = asyncio.current_task()
        assert running is not None
        # Unlike a thread, a coroutine can be stopped. The watchdog fails a stand-in, and the
        # call is cancelled; its own future settles once the coroutine has run its cleanup,
        # so the flow's reverts never overlap it (unless it ignores the cancel: see _abandon).
        deadline: cf.Future | None = None
        if limit is not None:
            deadline = cf.Future()
            deadline.add_done_callback(functools.partial(_cancel_soon, loop, running))
            deadline.add_done_callback(functools.partial(_abandon, loop, future, task.name))
            self._watchdog.started(deadline, task.name, outcome, limit)
        # A cancel of its flow interrupts it at its next await (a thread can only be told,
        # through its context's cancel_requested).
        stop_listening = (lambda: None) if ctx is None else ctx.signal.on_request(
            lambda _reason: _cancel_soon(loop, running, None))
        try:
            value = await coroutine()
        except asyncio.CancelledError as err:
            value = (outcome, Failure.from_exception(_interrupted(task, ctx, err)))
        finally:
            stop_listening()
            if deadline is not None:
                self._watchdog.finished(deadline)
        if deadline is not None and deadline.done():
            value = deadline.result()  # past its limit: whatever it ended with comes too late
        if not future.done():  # (_abandon settles it when the coroutine ignored its cancel)
            settle(future, value, task.name)

    def submit(self, work: Work) -> cf.Future:
        task, arguments, progress = work.task, work.arguments, work.progress_callback
        if work.action == REVERT:
            return self._dispatch(
                task, REVERTED, task.revert,
                functools.partial(revert_task, task, arguments, work.result, work.failures,
                                  progress, self._hooks),
                functools.partial(revert_task_async, task, arguments, work.result,
                                  work.failures, progress, self._hooks))
        if work.delay > 0:  # the engine waits out delays for an executor that does not take them
            raise ValueError(f"{type(self).__name__} does not take a delay (task "
                             f"{task.name!r} was given {work.delay} s)")
        return self._dispatch(
            task, EXECUTED, task.execute,
            functools.partial(execute_task, task, arguments, progress, self._hooks),
            functools.partial(execute_task_async, task, arguments, progress, self._hooks))


#: Default number of ``async def`` calls one local executor awaits at the same time.
DEFAULT_MAX_ASYNC_TASKS = 64


def _call_in(binding: context.Binding, call: Callable[[], Any]) -> Any:
    with context.bound(binding):
        return call()


def _coroutine_in(ctx: context.TaskContext | None,
                  coroutine: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """``coroutine`` with ``ctx`` current in the asyncio task that awaits it."""
    if ctx is None:
        return coroutine

    async def bound() -> Any:
        with context.bound(ctx):
            return await coroutine()

    return bound


def _interrupted(task: Task, ctx: context.TaskContext | None,
                 err: asyncio.CancelledError) -> Exception:
    """What an ``async def`` call cancelled at an await failed with: its flow's cancel, said
    so, or its engine's event loop stopping."""
    if ctx is not None and ctx.signal.requested:
        return exc.FlowCancelled(
            f"Task {task.name!r} was interrupted at an await: its flow is being cancelled "
            f"({ctx.signal.reason})", reason=ctx.signal.reason, cause=err)
    # A Failure holds an Exception, which CancelledError is not: say what happened instead.
    # (A time limit's cancel ends in the limit's own failure: see _await.)
    return exc.ExecutionFailure(
        f"Task {task.name!r} was cancelled at an await: its engine's event loop stopped",
        cause=err)


def _abandon(loop: asyncio.AbstractEventLoop, future: cf.Future, task_name: str,
             deadline: cf.Future) -> None:
    """Settle ``future`` with its time limit's failure if its cancelled coroutine has not
    ended within :data:`~.event_loop.SHUTDOWN_GRACE` (it ignored the cancel): the engine goes
    on rather than hang on it."""

    def give_up() -> None:
        if not future.done():
            LOG.warning("Task %r ignored the cancel its time limit sent for %.1f s; going on "
                        "without it", task_name, SHUTDOWN_GRACE)
            settle(future, deadline.result(), task_name)

    try:
        loop.call_soon_threadsafe(loop.call_later, SHUTDOWN_GRACE, give_up)
    except RuntimeError:
        give_up()  # the loop already closed: nothing is left to wait for


def _cancel_soon(loop: asyncio.AbstractEventLoop, task: asyncio.Task, _done: Any) -> None:
    if not task.done():
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:
            pass  # the loop already closed, and the task with it


class SerialTaskExecutor(LocalTaskExecutor):
    """Runs each task in the calling thread, at submission, one at a time.

    A call with a time limit runs on a helper thread while the caller waits for it or for the
    watchdog, whichever is first; an ``async def`` call is awaited on the executor's loop.
    """

    runs_inline = True

    def _plain(self, call: Callable[[], Any]) -> cf.Future:
        return _done_future(call())

    def _bounded(self, task: Task, outcome: str, call: Callable[[], Any],
                 limit: float) -> cf.Future:
        future: cf.Future = cf.Future()
        threading.Thread(target=self._timed, args=(future, task, outcome, call, limit),
                         daemon=True, name=f"flowengine-timed-{task.name}").start()
        cf.wait([future])
        return future

    def _awaited(self, task: Task, outcome: str, coroutine: Callable[[], Awaitable[Any]],
                 limit: float | None, ctx: context.TaskContext | None) -> cf.Future:
        future = super()._awaited(task, outcome, coroutine, limit, ctx)
        cf.wait([future])  # one task at a time, as for any other task
        return future


@runtime_checkable
class SubmitsCalls(Protocol):
    """An executor a program hands the parallel engine (``concurrent.futures``, futurist):
    all it needs is ``submit``, as TaskFlow's parallel engine."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Run ``fn(*args, **kwargs)`` some time; its future."""


class ParallelThreadTaskExecutor(LocalTaskExecutor):
    """Runs tasks on a thread pool (one the caller gives, or one of ``max_workers`` threads).

    A caller-supplied executor is used as is and never shut down by the engine. ``async def``
    calls do not take a pool thread: up to ``max_async_tasks`` of them are awaited at the same
    time on the executor's event loop thread.
    """

    def __init__(self, executor: SubmitsCalls | None = None, max_workers: int | None = None,
                 time_limits: Mapping[str, float] | None = None,
                 max_async_tasks: int | None = None, clock: Clock = time.monotonic,
                 hooks: Hooks | None = None) -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        super().__init__(time_limits, max_async_tasks, clock, hooks)
        self._given = executor
        self._max_workers = max_workers
        self._pool: SubmitsCalls | None = executor
        self._lock = threading.Lock()

    def start(self) -> None:
        super().start()
        with self._lock:
            if self._pool is None:
                self._pool = futurist.ThreadPoolExecutor(max_workers=self._max_workers)

    def stop(self) -> None:
        super().stop()
        with self._lock:
            if self._given is None and isinstance(self._pool, cf.Executor):
                # The engine only stops once every future it submitted has finished, so no work
                # is abandoned; waiting would only add futurist's ~1 s idle-thread poll per run.
                self._pool.shutdown(wait=False)
                self._pool = None

    def _submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = futurist.ThreadPoolExecutor(max_workers=self._max_workers)
        return self._pool.submit(fn, *args)

    def _plain(self, call: Callable[[], Any]) -> cf.Future:
        return self._submit(call)

    def _bounded(self, task: Task, outcome: str, call: Callable[[], Any],
                 limit: float) -> cf.Future:
        future: cf.Future = cf.Future()
        self._submit(self._timed, future, task, outcome, call, limit)
        return future
