"""Turning SIGINT and SIGTERM into a suspension of a running engine."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from flowengine.cli.signal_relay import relayed


@contextlib.contextmanager
def suspend_on_signals(engine: Any, tell: Callable[[str], None]) -> Iterator[threading.Event]:
    """While inside, the first SIGINT or SIGTERM suspends ``engine``; a second one acts as usual.

    Yields the event the signal sets. The caller suspends the engine at its next step when the
    event is set (the signal may have come in the middle of a write, so nothing changes the
    engine's state from the handler); the relay thread also suspends it, for engines blocked
    waiting on long-running atoms or retry delays. The handler itself only passes the signal on
    (see :mod:`flowengine.cli.signal_relay`).
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def suspend(signum: signal.Signals) -> None:
        tell(f"received {signum.name}: suspending (running atoms finish, "
             f"nothing new starts); send it again to stop at once")
        engine.suspend()

    # ``stop`` is set inside the handler so the very next step sees it (the caller only asks
    # ``is_set()``, so the main thread never holds the event's lock).
    with relayed(suspend, "flowengine-suspend", again="restore",
                 in_handler=lambda _sig: stop.set()):
        yield stop
