"""Reading the event stream on a thread while a test runs flows, then waiting for events."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flowengine.worker_based.events import EventReceiver

#: Seconds to wait for the receiver to listen, and for the events a test needs.
WAIT = 30.0


class Collector:
    """Reads events on a thread until closed; tests wait for what they need."""

    def __init__(self, receiver: EventReceiver) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(receiver,), daemon=True)
        self._thread.start()
        assert self._ready.wait(WAIT), "the receiver never listened"

    def _run(self, receiver: EventReceiver) -> None:
        for event in receiver.iter(ready=self._ready.set, stop=self._stop):
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()

    def wait_for(self, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        with self._cond:
            assert self._cond.wait_for(lambda: done(self.events), WAIT), self.events
            return list(self.events)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)
