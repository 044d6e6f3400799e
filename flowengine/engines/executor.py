"""Task executors: where a task's ``execute``/``revert`` actually run.

An executor returns a future whose result is ``(EXECUTED, result)`` or ``(REVERTED, result)``;
a raised exception comes back as a :class:`~flowengine.types.failure.Failure` result, never as
the future's exception. The worker-based engine supplies its own executor with the same API.
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import threading
from collections.abc import Callable, Mapping
from typing import Any

import futurist

from flowengine import tracing
from flowengine.atom import REVERT_FLOW_FAILURES, REVERT_RESULT
from flowengine.task import EVENT_UPDATE_PROGRESS
from flowengine.types.failure import Failure

EXECUTED = "executed"
REVERTED = "reverted"

ProgressCallback = Callable[..., None]


def _secret_values(task: Any, arguments: Mapping[str, Any]) -> list[str]:
    """The string forms of the arguments ``task`` marks secret (``secret_args``)."""
    names = getattr(task, "secret_args", ())
    return [str(arguments[name]) for name in names if arguments.get(name) not in (None, "")]


def _redact(task: Any, arguments: Mapping[str, Any], outcome: Any) -> Any:
    """Mask secret argument values in a failure before anything stores, logs or sends it."""
    if isinstance(outcome, Failure):
        secrets = _secret_values(task, arguments)
        if secrets:
            return outcome.redacted(secrets)
    return outcome


def _run(task: Any, pre: Callable[[], Any], call: Callable[[], Any], post: Callable[[], Any],
         progress_callback: ProgressCallback | None) -> Any:
    """Run ``pre``, ``call``, ``post`` with progress forwarded; an exception becomes a Failure."""
    registered = _listen(task, progress_callback)
    try:
        try:
            pre()
            outcome = call()
        except Exception:
            outcome = Failure()
        finally:
            try:
                post()
            except Exception:
                outcome = Failure()
    finally:
        _unlisten(task, progress_callback, registered)
    return outcome


def execute_task(
    task: Any, arguments: Mapping[str, Any], progress_callback: ProgressCallback | None = None
) -> tuple[str, Any]:
    """Run ``pre_execute``/``execute``/``post_execute`` here and now."""
    with tracing.task_scope(task):
        result = _run(task, task.pre_execute, lambda: task.execute(**arguments),
                      task.post_execute, progress_callback)
    return EXECUTED, _redact(task, arguments, result)


def revert_task(
    task: Any,
    arguments: Mapping[str, Any],
    result: Any,
    failures: Mapping[str, Failure],
    progress_callback: ProgressCallback | None = None,
) -> tuple[str, Any]:
    """Run ``pre_revert``/``revert``/``post_revert`` here and now."""
    kwargs = dict(arguments)
    kwargs[REVERT_RESULT] = result
    kwargs[REVERT_FLOW_FAILURES] = failures
    with tracing.task_scope(task):
        outcome = _run(task, task.pre_revert, lambda: task.revert(**kwargs), task.post_revert,
                       progress_callback)
    return REVERTED, _redact(task, arguments, outcome)


def _listen(task: Any, callback: ProgressCallback | None) -> bool:
    if callback is None or not hasattr(task, "notifier"):
        return False
    task.notifier.register(EVENT_UPDATE_PROGRESS, callback)
    return True


def _unlisten(task: Any, callback: ProgressCallback | None, registered: bool) -> None:
    if registered:
        task.notifier.deregister(EVENT_UPDATE_PROGRESS, callback)


class TaskExecutor(metaclass=abc.ABCMeta):
    """Runs tasks somewhere and hands back futures of their outcomes."""

    @abc.abstractmethod
    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Mapping[str, Any],
        progress_callback: ProgressCallback | None = None,
    ) -> cf.Future:
        """Schedule ``task.execute(**arguments)``."""

    @abc.abstractmethod
    def revert_task(
        self,
        task: Any,
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


def _done_future(value: Any) -> cf.Future:
    future: cf.Future = cf.Future()
    future.set_result(value)
    return future


class SerialTaskExecutor(TaskExecutor):
    """Runs each task in the calling thread, at submission."""

    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Mapping[str, Any],
        progress_callback: ProgressCallback | None = None,
    ) -> cf.Future:
        return _done_future(execute_task(task, arguments, progress_callback))

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure],
        progress_callback: ProgressCallback | None = None,
    ) -> cf.Future:
        return _done_future(revert_task(task, arguments, result, failures, progress_callback))


class ParallelThreadTaskExecutor(TaskExecutor):
    """Runs tasks on a thread pool (one the caller gives, or one of ``max_workers`` threads).

    A caller-supplied executor is used as is and never shut down by the engine.
    """

    def __init__(self, executor: cf.Executor | None = None, max_workers: int | None = None) -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self._given = executor
        self._max_workers = max_workers
        self._pool: cf.Executor | None = executor
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = futurist.ThreadPoolExecutor(max_workers=self._max_workers)

    def stop(self) -> None:
        with self._lock:
            if self._given is None and self._pool is not None:
                # The engine only stops once every future it submitted has finished, so no work
                # is abandoned; waiting would only add futurist's ~1 s idle-thread poll per run.
                self._pool.shutdown(wait=False)
                self._pool = None

    def _submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        if self._pool is None:
            self.start()
        assert self._pool is not None
        return self._pool.submit(fn, *args)

    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Mapping[str, Any],
        progress_callback: ProgressCallback | None = None,
    ) -> cf.Future:
        return self._submit(execute_task, task, arguments, progress_callback)

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Mapping[str, Any],
        result: Any,
        failures: Mapping[str, Failure],
        progress_callback: ProgressCallback | None = None,
    ) -> cf.Future:
        return self._submit(revert_task, task, arguments, result, failures, progress_callback)


class DelayTimer:
    """Futures that complete after a delay, for retry backoff without blocking the engine."""

    def __init__(self) -> None:
        self._timers: list[tuple[threading.Timer, cf.Future]] = []

    def after(self, seconds: float, value: Any) -> cf.Future:
        """A future whose result is ``value``, ``seconds`` from now."""
        future: cf.Future = cf.Future()
        if seconds <= 0:
            future.set_result(value)
            return future
        timer = threading.Timer(seconds, _complete, args=(future, value))
        timer.daemon = True
        self._timers.append((timer, future))
        timer.start()
        return future

    def cancel_all(self) -> None:
        """Stop every pending timer and cancel its future (waking whoever waits on it)."""
        timers, self._timers = self._timers, []
        for timer, future in timers:
            timer.cancel()
            future.cancel()


def _complete(future: cf.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)
