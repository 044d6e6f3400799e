"""Turning SIGINT and SIGTERM into a suspension of a running engine."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def suspend_on_signals(engine: Any, tell: Callable[[str], None]) -> Iterator[threading.Event]:
    """While inside, the first SIGINT or SIGTERM suspends ``engine``; a second one acts as usual.

    Yields the event the signal sets. The caller suspends the engine at its next step when the
    event is set (the handler may have interrupted the engine in the middle of a write, so it
    must not change the engine's state itself); a helper thread also suspends it, for engines
    blocked waiting on long-running atoms or retry delays.
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous: dict[signal.Signals, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        for sig, old in previous.items():
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else old)
        stop.set()
        tell(f"received {signal.Signals(signum).name}: suspending (running atoms finish, "
             f"nothing new starts); send it again to stop at once")
        threading.Thread(target=engine.suspend, name="flowengine-suspend", daemon=True).start()

    for sig in _SIGNALS:
        previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)
