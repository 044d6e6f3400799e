"""The live side: one thread reads the event stream and hands each event to every open page.

The hub keeps what pages opened later need: the workers heard from (through the ``workers``
command's :class:`~flowengine.cli.workers.WorkerTable`), those gone offline, and the recent
events of each flow (the timeline of a flow the dashboard watched). Pages subscribe with an
asyncio queue; a page that does not keep up loses events, never the hub.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowengine.cli.workers import WorkerTable
from flowengine.persistence.backends._uri import mask_urls

LOG = logging.getLogger(__name__)

#: Events kept per flow, and flows kept (the least recently heard are forgotten first).
EVENTS_PER_FLOW = 5_000
FLOWS_KEPT = 500
#: Events a page may have waiting before it misses some.
SUBSCRIBER_QUEUE = 1_000
#: A worker silent this long (seconds) is shown as missing its heartbeats.
SILENT_AFTER = 10.0


class Subscription:
    """Events for one page, read with ``await subscription.get()``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, flow: str | None) -> None:
        self.loop, self.flow = loop, flow
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(SUBSCRIBER_QUEUE)

    def offer(self, event: dict[str, Any]) -> None:
        if self.flow is not None and event.get("flow_uuid") not in (None, self.flow):
            return
        self.loop.call_soon_threadsafe(self._put, event)

    def _put(self, event: dict[str, Any]) -> None:
        if not self.queue.full():  # a slow page misses events; it still reloads its fragments
            self.queue.put_nowait(event)

    async def get(self) -> dict[str, Any]:
        """The next event."""
        return await self.queue.get()


class EventHub:
    """Follows ``<exchange>.events`` and fans events out to pages.

    Args:
        receiver: Makes the event receiver (an ``EventReceiver``-like object with ``iter``
            and ``where``); None means there is no broker to follow.
        clock: UNIX time, for heartbeat ages.
    """

    def __init__(self, receiver: Callable[[], Any] | None,
                 clock: Callable[[], float] = time.time) -> None:
        self._receiver, self._clock = receiver, clock
        self._workers = WorkerTable()
        self._gone: dict[str, dict[str, Any]] = {}
        self._flows: collections.OrderedDict[str, collections.deque[dict[str, Any]]] = (
            collections.OrderedDict())
        self._subscribers: set[Subscription] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()
        self.error: str | None = None
        self.where = "no broker"

    def start(self) -> None:
        """Start following the stream (from a daemon thread)."""
        if self._receiver is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="flowengine-dashboard-events",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following (within a fraction of a second)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        assert self._receiver is not None
        delay = 0.5
        while not self._stop.is_set():
            try:
                receiver = self._receiver()
                self.where = receiver.where
                for event in receiver.iter(ready=self._ready, stop=self._stop):
                    self.publish(event)
                    delay = 0.5
            except Exception as err:  # the broker went away: say so on the pages, retry
                self.listening.clear()
                self.error = mask_urls(f"{type(err).__name__}: {err}")
                LOG.warning("Event stream of %s failed (%s); retrying in %.1fs",
                            self.where, self.error, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)

    def _ready(self) -> None:
        self.error = None
        self.listening.set()

    def publish(self, event: dict[str, Any]) -> None:
        """Take in one event (the stream's thread calls it; tests may too)."""
        kind = str(event.get("type", ""))
        if kind.startswith("worker-"):
            self._workers.on_event(event)
            worker = event.get("worker")
            with self._lock:
                if kind == "worker-offline" and isinstance(worker, str):
                    self._gone[worker] = dict(event)
                elif isinstance(worker, str):
                    self._gone.pop(worker, None)
        flow = event.get("flow_uuid")
        with self._lock:
            if isinstance(flow, str):
                kept = self._flows.pop(flow, None) or collections.deque(maxlen=EVENTS_PER_FLOW)
                kept.append(event)
                self._flows[flow] = kept
                while len(self._flows) > FLOWS_KEPT:
                    self._flows.popitem(last=False)
            subscribers = list(self._subscribers)
        for subscription in subscribers:
            subscription.offer(event)

    def subscribe(self, flow: str | None = None) -> Subscription:
        """A new page's subscription (call from the event loop's thread)."""
        subscription = Subscription(asyncio.get_running_loop(), flow)
        with self._lock:
            self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop sending to a page that closed."""
        with self._lock:
            self._subscribers.discard(subscription)

    def events_of(self, flow: str) -> list[dict[str, Any]]:
        """The events heard of ``flow``, oldest first."""
        with self._lock:
            return list(self._flows.get(flow, ()))

    def workers(self) -> list[dict[str, Any]]:
        """Live workers (with ``silent``: no heartbeat for a while), then the gone ones."""
        now = self._clock()
        rows = []
        for row in self._workers.live():
            beat = row.get("last_heartbeat")
            row["gone"] = False
            row["silent"] = isinstance(beat, (int, float)) and now - beat > SILENT_AFTER
            row["age"] = now - beat if isinstance(beat, (int, float)) else None
            rows.append(row)
        with self._lock:
            gone = [_gone_row(w, e, now) for w, e in sorted(self._gone.items())]
        return rows + gone


def _gone_row(worker: str, event: Mapping[str, Any], now: float) -> dict[str, Any]:
    stamp = event.get("timestamp")
    return {"worker": worker, "topics": [event["topic"]] if event.get("topic") else [],
            "tasks": [], "capacity": None, "free": None, "in_flight": None,
            "hostname": event.get("hostname"), "pid": event.get("pid"),
            "last_heartbeat": stamp, "gone": True, "silent": False,
            "age": now - stamp if isinstance(stamp, (int, float)) else None}
