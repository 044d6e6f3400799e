"""The test kit's workers: real :class:`~flowengine.worker_based.worker.Worker` s on threads of
the test process, over the in-process memory transport, each on a line of its own that the kit
can sever to lose it (:mod:`~flowengine.worker_based.broker.transport_severable`).

Each worker runs its requests on a pool that counts what it holds, from the moment a request
arrives until it is acknowledged, so the kit knows when every worker is idle before it skips
time. A lost worker is replaced at once, as a process supervisor would restart it.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import threading
from collections.abc import Callable, Iterable
from typing import Any

from flowengine import task as task_mod
from flowengine.worker_based.broker import transport_severable as ts
from flowengine.worker_based.worker import Worker

#: Seconds a worker gets to start consuming, and to stop.
START_TIMEOUT = 30.0
STOP_GRACE = 0.5


class CountingPool(cf.ThreadPoolExecutor):
    """A thread pool that knows how many of the calls given to it have not finished."""

    def __init__(self, threads: int, prefix: str, changed: Callable[[], None]) -> None:
        super().__init__(max_workers=threads, thread_name_prefix=prefix)
        self._pending = 0
        self._lock = threading.Lock()
        self._changed = changed

    @property
    def pending(self) -> int:
        """Calls submitted and not finished."""
        with self._lock:
            return self._pending

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        with self._lock:
            self._pending += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished()
            raise
        future.add_done_callback(lambda _f: self._finished())
        return future

    def _finished(self) -> None:
        with self._lock:
            self._pending -= 1
        self._changed()


class KitWorker:
    """One worker of the kit, on its own thread and line."""

    def __init__(self, kit_id: str, name: str, exchange: str, topic: str,
                 classes: Iterable[type[task_mod.Task]], threads: int,
                 changed: Callable[[], None]) -> None:
        self.name = name
        self.line = f"{kit_id}:{name}"
        self.prefix = f"{self.line}:task"
        self.pool = CountingPool(threads, self.prefix, changed)
        self.lost = False
        self.worker = Worker(exchange, topic, tasks=list(classes), executor=self.pool,
                             threads_count=threads, transport=ts.Transport,
                             transport_options={ts.LINE_OPTION: self.line}, events=False)
        self._thread = threading.Thread(target=self.worker.run,
                                        kwargs={"display_banner": False},
                                        name=f"{self.line}:consumer", daemon=True)

    def start(self) -> None:
        """Start serving; raise if it does not consume within :data:`START_TIMEOUT`."""
        self._thread.start()
        if not self.worker.wait(START_TIMEOUT):
            raise RuntimeError(f"test kit worker {self.name} did not start consuming within "
                               f"{START_TIMEOUT}s")

    @property
    def busy(self) -> bool:
        """Whether it holds a request it has not acknowledged (a lost worker never counts)."""
        return not self.lost and self.pool.pending > 0

    def stop(self) -> None:
        """Stop serving and release its threads."""
        self.worker.stop(grace=0.0 if self.lost else STOP_GRACE)
        self._thread.join(timeout=START_TIMEOUT)
        self.pool.shutdown(wait=False, cancel_futures=True)
        ts.forget(self.line)


class Fleet:
    """The kit's workers: started for the task classes the flows need, lost and replaced.

    Args:
        kit_id: Names the workers' lines and threads (unique per kit).
        exchange, topic: Where they serve.
        size: How many run at once.
        threads: Task threads of each.
        changed: Called whenever a worker may have become idle.
    """

    def __init__(self, kit_id: str, exchange: str, topic: str, size: int, threads: int,
                 changed: Callable[[], None]) -> None:
        self._kit_id, self.exchange, self.topic = kit_id, exchange, topic
        self._size, self._threads, self._changed = size, threads, changed
        self._classes: set[type[task_mod.Task]] = set()
        self._workers: list[KitWorker] = []
        self._names = itertools.count(1)
        self._lock = threading.RLock()

    @property
    def workers(self) -> list[KitWorker]:
        """Every worker started so far (lost ones too)."""
        with self._lock:
            return list(self._workers)

    @property
    def busy(self) -> bool:
        """Whether a live worker holds a request."""
        return any(w.busy for w in self.workers)

    def serve(self, classes: Iterable[type[task_mod.Task]]) -> None:
        """Have the live workers serve ``classes`` too (restarting them if they do not)."""
        with self._lock:
            wanted = self._classes | set(classes)
            if wanted == self._classes and self._live():
                return
            self._classes = wanted
            for worker in self._live():
                worker.stop()
            self._workers = [w for w in self._workers if w.lost]
            for _ in range(self._size):
                self._start()

    def _live(self) -> list[KitWorker]:
        return [w for w in self._workers if not w.lost]

    def _start(self) -> KitWorker:
        worker = KitWorker(self._kit_id, f"worker-{next(self._names)}", self.exchange,
                           self.topic, sorted(self._classes, key=lambda c: c.__qualname__),
                           self._threads, self._changed)
        self._workers.append(worker)
        worker.start()
        return worker

    def named(self, name: str) -> KitWorker | None:
        """The worker called ``name``."""
        return next((w for w in self.workers if w.name == name), None)

    def of_thread(self, thread_name: str) -> KitWorker | None:
        """The worker whose task thread is called ``thread_name``."""
        return next((w for w in self.workers if thread_name.startswith(w.prefix)), None)

    def lose(self, worker: KitWorker) -> None:
        """Lose ``worker`` as a killed process is lost, and start one in its place."""
        with self._lock:
            if worker.lost:
                return
            worker.lost = True
            ts.sever(worker.line)
            self._start()

    def stop(self) -> None:
        """Stop every worker."""
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()
