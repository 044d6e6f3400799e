"""A worker's task pool that grows with the backlog and shrinks when idle (``--autoscale``).

:class:`Autoscaler` makes the decisions (grow when a request finds no idle thread, up to the
maximum; retire a thread idle for ``keepalive`` seconds, down to the minimum) and says what the
broker prefetch should be: one more than the pool while it may still grow, so a backlog shows
up as a request waiting for a thread, and the pool itself at the maximum. :class:`AutoscalePool`
is the ``concurrent.futures.Executor`` that follows those decisions.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

#: Seconds a task thread stays idle before it is retired (above the minimum).
DEFAULT_KEEPALIVE = 10.0


class Autoscaler:
    """Pool sizing decisions (not thread-safe: :class:`AutoscalePool` holds a lock).

    Args:
        max_threads: Most task threads.
        min_threads: Fewest task threads (started at once).
        keepalive: Seconds a thread may stay idle before it is retired.
        clock: Monotonic clock in seconds (injected by tests).

    Raises:
        ValueError: ``min_threads`` is negative or above ``max_threads``, or ``max_threads``
            is below 1.
    """

    def __init__(self, max_threads: int, min_threads: int, keepalive: float = DEFAULT_KEEPALIVE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_threads < 1 or not 0 <= min_threads <= max_threads:
            raise ValueError(f"autoscale needs 0 <= MIN <= MAX and MAX >= 1, got "
                             f"MAX={max_threads} MIN={min_threads}")
        self.max_threads, self.min_threads = max_threads, min_threads
        self.keepalive, self._clock = keepalive, clock
        self.size = 0  # threads alive
        self.busy = 0  # threads running a request
        self.queued = 0  # requests waiting for a thread

    def now(self) -> float:
        """The scaler's clock."""
        return self._clock()

    def submitted(self) -> bool:
        """A request came in; True when a thread must be started for it."""
        self.queued += 1
        idle = self.size - self.busy
        if self.queued > idle and self.size < self.max_threads:
            self.size += 1
            return True
        return False

    def started(self) -> None:
        """A thread took a waiting request."""
        self.queued -= 1
        self.busy += 1

    def finished(self) -> float:
        """A thread finished its request; returns when it became idle."""
        self.busy -= 1
        return self._clock()

    def retire(self, idle_since: float) -> bool:
        """Whether a thread idle since ``idle_since`` (and nothing queued) exits now."""
        if self.queued or self.size <= self.min_threads:
            return False
        if self._clock() - idle_since < self.keepalive:
            return False
        self.size -= 1
        return True

    @property
    def prefetch(self) -> int:
        """The broker prefetch: the pool plus one while it can grow (a backlog shows up)."""
        return max(self.size + (1 if self.size < self.max_threads else 0), 1)


class AutoscalePool(Executor):
    """An executor whose threads follow an :class:`Autoscaler`.

    Args:
        scaler: The decisions.
        thread_name_prefix: Names of the task threads.
    """

    def __init__(self, scaler: Autoscaler, thread_name_prefix: str = "flowengine-task") -> None:
        self.scaler = scaler
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], Any, Any] | None]
        self._work = queue.SimpleQueue()
        self._shutdown = False
        self._threads: set[threading.Thread] = set()
        self._count = 0
        with self._lock:
            for _ in range(scaler.min_threads):
                scaler.size += 1
                self._start()

    @property
    def size(self) -> int:
        """Task threads now."""
        return self.scaler.size

    @property
    def prefetch(self) -> int:
        """The broker prefetch the pool wants now."""
        with self._lock:
            return self.scaler.prefetch

    def _start(self) -> None:
        self._count += 1
        thread = threading.Thread(target=self._run, name=f"{self._prefix}_{self._count}",
                                  daemon=True)
        self._threads.add(thread)
        thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on a task thread (one is started if none is idle).

        Raises:
            RuntimeError: The pool was shut down.
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self.scaler.submitted():
                self._start()
            self._work.put((future, fn, args, kwargs))
        return future

    def _run(self) -> None:
        idle_since = self.scaler.now()
        while True:
            try:
                # Waking up now and then is what lets an idle thread retire.
                item = self._work.get(timeout=min(self.scaler.keepalive, 1.0))
            except queue.Empty:
                with self._lock:
                    if self._shutdown or self.scaler.retire(idle_since):
                        self._threads.discard(threading.current_thread())
                        return
                continue
            if item is None:  # shutdown
                return
            future, fn, args, kwargs = item
            with self._lock:
                self.scaler.started()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as err:  # handed to the future, as ThreadPoolExecutor does
                    future.set_exception(err)
            with self._lock:
                idle_since = self.scaler.finished()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; the threads exit once the queued work is done."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()
