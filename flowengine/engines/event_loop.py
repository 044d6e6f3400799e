"""An asyncio event loop on a thread of its own, where local engines await ``async def`` tasks.

Each local task executor owns one for the length of a run, started when the first coroutine
arrives, so flows without async tasks never start it. Running the loop on its own thread keeps
engines usable from code that already runs an event loop (``engine.run()`` inside a coroutine).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import threading
from collections.abc import Coroutine
from typing import Any

LOG = logging.getLogger(__name__)

#: Seconds a stopping loop gives cancelled coroutines to finish their cleanup.
SHUTDOWN_GRACE = 1.0


class EventLoopThread:
    """One event loop, run forever on a daemon thread until :meth:`stop`.

    Args:
        max_concurrent: coroutines submitted through :meth:`limited` that may run at once.
    """

    def __init__(self, max_concurrent: int) -> None:
        self._max_concurrent = max_concurrent
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop (started on first use)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._slots = asyncio.Semaphore(self._max_concurrent)
                self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                                name="flowengine-async-tasks")
                self._thread.start()
            return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> cf.Future:
        """Run ``coroutine`` on the loop once one of ``max_concurrent`` slots is free."""
        return asyncio.run_coroutine_threadsafe(self._limited(coroutine), self.loop)

    async def _limited(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        assert self._slots is not None
        async with self._slots:
            return await coroutine

    def stop(self) -> None:
        """Cancel what still runs (timed out, say), stop the loop and end its thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


async def _cancel_all() -> None:
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current]
    for task in left:
        task.cancel()
    if left:
        _, pending = await asyncio.wait(left, timeout=SHUTDOWN_GRACE)
        if pending:
            LOG.warning("%d async task(s) ignored cancellation; abandoning them", len(pending))
