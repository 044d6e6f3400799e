"""Worker discovery: which workers exist, what they run, and how busy they are.

Workers are learned from NOTIFY replies, whether answers to an engine's own NOTIFY (how TaskFlow
workers are found) or announcements flowengine workers broadcast when they start and stop. Each
worker process is tracked by its own id when it sends one (flowengine), else by its topic
(TaskFlow, whose processes sharing a topic are indistinguishable).

Only workers on the engine's own topics are kept (all of the exchange's when it lists none):
every flowengine worker on an exchange answers the discovery broadcast and announces itself
to every engine there, and services partition their workers by topic (cells, regions,
hardware), so a worker of another topic must never be sent work, as with TaskFlow.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flowengine.worker_based.wire.headers import QUIET_START_PROTOCOL

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class TopicWorker:
    """One known worker.

    Attributes:
        topic: the queue suffix its requests are published to.
        tasks: fully-qualified names of the task classes it runs.
        identity: its worker id (its topic for TaskFlow workers).
        capacity: free task slots it last advertised (None: unknown).
        last_seen: when it was last heard from (the finder's clock).
        flowengine: whether it speaks flowengine's header extensions.
        silent: a lease it held lapsed (no heartbeat): it is sent nothing until it is heard
            from again.
        passed_over: a request sent to its topic was not taken in time while nothing was heard
            from the topic (a worker that announces itself and never consumes, or one cut off
            from its queue): any other capable worker is preferred until it is heard from again.
        versions: the version of each task class it announced (TaskFlow workers announce
            none: they are sent any version).
        protocol: the flowengine protocol version it speaks (0: a TaskFlow worker).
        asked_at: when it was asked to show it is alive, as a request of its topic waited
            untaken while it had not been heard from (None: not asked, or it answered).
        judged: it left that question unanswered: the requests of its topic that waited
            untaken then were sent again, once, until it is heard from again.
    """

    topic: str
    tasks: frozenset[str]
    identity: str
    capacity: int | None = None
    last_seen: float = 0.0
    flowengine: bool = False
    in_flight: int = 0
    silent: bool = False
    passed_over: bool = False
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    protocol: int = 0
    asked_at: float | None = None
    judged: bool = False

    @property
    def quiet_start(self) -> bool:
        """Whether it sends no RUNNING reply for a short task (flowengine protocol 2)."""
        return self.protocol >= QUIET_START_PROTOCOL

    def performs(self, task_cls: str, major: str | None = None) -> bool:
        """Whether it runs the named task class (at major version ``major``, if given and it
        announced the class's version)."""
        if task_cls not in self.tasks:
            return False
        served = self.versions.get(task_cls)
        return major is None or served is None or served.split(".")[0] == major


class WorkerFinder:
    """Keeps the set of known workers and picks one for a task.

    Args:
        expiry: seconds after which a worker not heard from is forgotten (None or <= 0: never).
        clock: monotonic clock in seconds (injected by tests).
        on_change: called (without locks held) whenever a worker appears or comes back.
        topics: the only topics whose workers are kept (empty: every topic).
    """

    def __init__(
        self,
        expiry: float | None = 60.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
        topics: Iterable[str] = (),
    ) -> None:
        self._topics = frozenset(topics)
        self._expiry = expiry if expiry and expiry > 0 else None
        self._clock = clock
        self._on_change = on_change
        self._workers: dict[str, TopicWorker] = {}
        #: When each topic was last heard from (a reply to a request sent there).
        self._heard: dict[str, float] = {}
        self._lock = threading.Lock()
        self._appeared = threading.Condition(self._lock)

    @property
    def total_workers(self) -> int:
        """How many workers are known."""
        with self._lock:
            return len(self._workers)

    def workers(self) -> list[TopicWorker]:
        """A snapshot of the known workers."""
        with self._lock:
            return list(self._workers.values())

    def serves(self, topic: str) -> bool:
        """Whether workers of ``topic`` may be sent work (one of the topics, or none listed)."""
        return not self._topics or topic in self._topics

    def add(
        self,
        topic: str,
        tasks: Iterable[str],
        identity: str | None = None,
        capacity: int | None = None,
        flowengine: bool = False,
        versions: dict[str, str] | None = None,
        protocol: Any = None,
    ) -> TopicWorker | None:
        """Record (or refresh) a worker from a NOTIFY reply or announcement; None (and nothing
        kept) for a worker of a topic this finder does not serve."""
        if not self.serves(topic):
            return None
        key = identity or topic
        with self._lock:
            worker = self._workers.get(key)
            new = worker is None or worker.tasks != frozenset(tasks)
            if worker is None:
                worker = TopicWorker(topic, frozenset(tasks), key, flowengine=flowengine)
                self._workers[key] = worker
                LOG.info("Discovered worker %s (topic %r, %d tasks)", key, topic, len(worker.tasks))
            worker.tasks = frozenset(tasks)
            if versions is not None:
                new = new or worker.versions != versions
                worker.versions = versions
            worker.topic = topic
            worker.protocol = (protocol_version(protocol) if protocol is not None
                               else int(flowengine))
            worker.last_seen = self._clock()
            new = new or worker.silent or worker.passed_over
            _heard_from(worker)
            if capacity is not None:
                worker.capacity = capacity
            if new:
                self._appeared.notify_all()
        if new and self._on_change is not None:
            self._on_change()
        return worker

    def get(self, identity: str | None) -> TopicWorker | None:
        """The worker with this identity, if known."""
        if not identity:
            return None
        with self._lock:
            return self._workers.get(identity)

    def remove(self, identity: str) -> TopicWorker | None:
        """Forget a worker (it said it went offline)."""
        with self._lock:
            worker = self._workers.pop(identity, None)
        if worker is not None:
            LOG.info("Worker %s (topic %r) went offline", identity, worker.topic)
        return worker

    def seen(self, identity: str | None, capacity: int | None = None) -> bool:
        """Refresh a worker's liveness (and capacity) from any message it sent; return
        whether it was silent until now."""
        if not identity:
            return False
        with self._lock:
            worker = self._workers.get(identity)
            silent = worker is not None and worker.silent
            back = silent or (worker is not None and worker.passed_over)
            if worker is not None:
                worker.last_seen = self._clock()
                _heard_from(worker)
                if capacity is not None:
                    worker.capacity = capacity
        if back and self._on_change is not None:
            self._on_change()  # requests may wait for it
        return silent

    def silence(self, identity: str) -> TopicWorker | None:
        """Send nothing more to a worker whose lease lapsed (dead, frozen or cut off) until
        anything is heard from it again; return it if it is known."""
        with self._lock:
            worker = self._workers.get(identity)
            if worker is not None:
                worker.silent = True
        return worker

    def heard_on(self, topic: str) -> None:
        """A reply came back for a request sent to ``topic``: its queue is being consumed."""
        with self._lock:
            self._heard[topic] = self._clock()
            for worker in self._workers.values():
                if worker.topic == topic:
                    worker.passed_over = False

    def quiet_starts(self, topic: str) -> bool:
        """Whether a worker of ``topic`` may run a request without a RUNNING reply first (a
        flowengine protocol 2 worker, or an unknown one: it is assumed to)."""
        with self._lock:
            workers = [w for w in self._workers.values() if w.topic == topic]
        return not workers or any(w.quiet_start for w in workers)

    def quiet_since(self, topic: str, since: float) -> bool:
        """Whether nothing was heard from ``topic`` since ``since`` (the finder's clock)."""
        with self._lock:
            return self._heard.get(topic, -math.inf) < since

    def pass_over(self, topic: str) -> list[TopicWorker]:
        """Prefer any other capable worker to those of ``topic`` (its requests are not taken)
        until one of them is heard from again; return them."""
        with self._lock:
            passed = [w for w in self._workers.values() if w.topic == topic]
            for worker in passed:
                worker.passed_over = True
        return passed

    def ask(self, topic: str, since: float) -> bool:
        """Mark for a proof of life the flowengine workers of ``topic`` not heard from since
        ``since`` and not judged already (a request of the topic waits untaken: a worker that
        froze, or lost its process, may hold it unstarted); return whether any was marked
        that was not being asked already (the caller then asks every worker to answer)."""
        now = self._clock()
        asked = False
        with self._lock:
            for worker in self._workers.values():
                if (worker.topic == topic and worker.flowengine and not worker.judged
                        and worker.asked_at is None and worker.last_seen < since):
                    worker.asked_at = now
                    asked = True
        return asked

    @property
    def asking(self) -> bool:
        """Whether a proof of life is awaited from any worker."""
        with self._lock:
            return any(w.asked_at is not None for w in self._workers.values())

    def next_verdict(self, window: float, now: float) -> float:
        """When the clock next decides on a worker asked for a proof of life (see
        :meth:`unanswered`): the end of its ``window``, or once that has passed unanswered
        (an answer may wait unread in a backlog), the end of the second; ``math.inf`` if no
        worker is asked."""
        with self._lock:
            ends = [w.asked_at + (window if now < w.asked_at + window else 2 * window)
                    for w in self._workers.values() if w.asked_at is not None]
        return min(ends, default=math.inf)

    def unanswered(self, window: float, caught_up: float | None) -> list[TopicWorker]:
        """The workers asked for a proof of life more than ``window`` seconds ago that have
        sent nothing since: each is judged (and silent: it is sent nothing until it is heard
        from again). ``caught_up``: when every message sent to this process was last read
        (None: taken as now); an answer that may still wait unread is waited for, up to a
        second window."""
        now = self._clock()
        with self._lock:
            judged = []
            for worker in self._workers.values():
                asked = worker.asked_at
                if asked is None or now < asked + window:
                    continue
                if caught_up is not None and caught_up < asked + window \
                        and now < asked + 2 * window:
                    continue
                worker.asked_at = None
                worker.judged = worker.silent = True
                judged.append(worker)
        return judged

    def expire(self) -> list[TopicWorker]:
        """Forget workers not heard from within the expiry; return them."""
        if self._expiry is None:
            return []
        cutoff = self._clock() - self._expiry
        with self._lock:
            gone = [w for w in self._workers.values() if w.last_seen < cutoff]
            for worker in gone:
                del self._workers[worker.identity]
        for worker in gone:
            LOG.warning(
                "Worker %s (topic %r) expired: not heard from in %.0fs",
                worker.identity,
                worker.topic,
                self._expiry,
            )
        return gone

    def get_worker_for_task(self, task_cls: str, avoid: Iterable[str] = (),
                            major: str | None = None) -> TopicWorker | None:
        """Pick a worker that runs ``task_cls`` (at major version ``major``, if given): the
        least loaded, avoiding passed-over workers and then ``avoid`` if possible.

        Load is the worker's in-flight count against its advertised capacity; ties are broken at
        random so equal workers share the work.
        """
        with self._lock:
            capable = [w for w in self._workers.values()
                       if w.performs(task_cls, major) and not w.silent]
        if not capable:
            return None
        avoided = set(avoid)
        capable = [w for w in capable if not w.passed_over] or capable
        preferred = [w for w in capable if w.identity not in avoided] or capable
        random.shuffle(preferred)
        return min(preferred, key=_load)

    def runs(self, task_cls: str, major: str | None = None) -> bool:
        """Whether a known worker runs ``task_cls`` (at major version ``major``, if given),
        silent ones included: a worker that fell silent may be heard from again."""
        with self._lock:
            return any(w.performs(task_cls, major) for w in self._workers.values())

    def wait_for_workers(self, workers: int = 1, timeout: float | None = None) -> int:
        """Block until ``workers`` are known; return how many are still missing."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while len(self._workers) < workers:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._appeared.wait(remaining)
            return max(workers - len(self._workers), 0)

    def clear(self) -> None:
        """Forget every worker."""
        with self._lock:
            self._workers.clear()


def _heard_from(worker: TopicWorker) -> None:
    """``worker`` sent something: whatever its silence made of it is over (lock held)."""
    worker.silent = worker.passed_over = worker.judged = False
    worker.asked_at = None


def _load(worker: TopicWorker) -> tuple[float, int]:
    if worker.capacity is None:
        return (0.5, worker.in_flight)
    slots = worker.capacity + worker.in_flight
    return (worker.in_flight / slots if slots else 1.0, worker.in_flight)


def protocol_version(value: Any) -> int:
    """The protocol version a ``x-flowengine-protocol`` header value says (0: no header, a
    TaskFlow peer; 1 for a value that is not a positive whole number)."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 1


def header(headers: Any, name: str) -> Any:
    """Read a header from a message's headers (which may be None)."""
    return (headers or {}).get(name)
