"""Signal handlers that only pass the signal on: the work it asks for runs on a thread of its own.

A Python signal handler runs in the main thread between two bytecodes of whatever that thread
was doing, possibly while it holds a non-reentrant lock: ``threading``'s thread table while
starting a pool thread, an ``Event``'s condition, a stream's buffer. A handler that then starts a
thread, sets an event or writes a line can wait for that lock for ever, and every later signal
finds the main thread stuck. That is how a worker once ignored Ctrl-C and SIGTERM alike until it
was killed. The handlers installed here write the signal's number to a pipe, which takes no
Python lock; a thread started beforehand reads it and calls the callback, where locks are safe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

#: What Ctrl-C and ``kill`` send: the signals the command-line tools stop or suspend on.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: Written to the pipe to end the relay thread; no signal has number 0.
_END = 0

#: What a signal does after the first: relayed as well, SystemExit(1) at once in the main
#: thread (raising takes no lock, as the default SIGINT handler's KeyboardInterrupt), or what
#: the handlers found at install do (SIGINT: KeyboardInterrupt).
Again = Literal["relay", "exit", "restore"]


class SignalRelay:
    """Calls ``on_signal`` on the relay thread for each signal received while installed.

    Args:
        on_signal: called with each signal, in order, on the relay thread (never in a handler).
        name: the relay thread's name.
        again: what a signal after the first does (see :data:`Again`).
        in_handler: called with each relayed signal inside the handler itself, before the relay
            thread hears of it, for what must be seen at once by the code the signal
            interrupted; it must take no lock that code may hold (setting an ``Event`` the
            main thread never waits on is fine).
        signals: the signals to handle.
    """

    def __init__(self, on_signal: Callable[[signal.Signals], None],
                 name: str = "flowengine-signals", again: Again = "relay",
                 in_handler: Callable[[signal.Signals], None] | None = None,
                 signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        self._on_signal = on_signal
        self._in_handler = in_handler
        self._name = name
        self._again = again
        self._signals = tuple(signals)
        self._previous: dict[signal.Signals, Any] = {}
        self._read_fd = -1
        self._write_fd = -1
        self._thread: threading.Thread | None = None
        #: Set by the handler (a plain attribute: reading or setting it takes no lock).
        self.received = False

    def install(self) -> None:
        """Start the relay thread, then install the handlers (main thread only)."""
        self._read_fd, self._write_fd = os.pipe()
        # A full pipe must not block the main thread inside the handler: drop the byte instead
        # (the relay thread is then already behind with signals it will act on).
        os.set_blocking(self._write_fd, False)
        self._thread = threading.Thread(target=self._relay, name=self._name, daemon=True)
        self._thread.start()
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put back the handlers found at :meth:`install` and end the relay thread."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        self._send(_END)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.received and self._again == "exit":
            raise SystemExit(1)
        self.received = True
        if self._again == "restore":
            # ``signal.signal`` takes no Python lock, so it is safe here; SIGINT goes back to
            # raising KeyboardInterrupt even if it was ignored before.
            for sig, previous in self._previous.items():
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else previous)
        if self._in_handler is not None:
            self._in_handler(signal.Signals(signum))
        self._send(signum)

    def _send(self, value: int) -> None:
        if self._write_fd < 0:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write_fd, bytes([value]))

    def _relay(self) -> None:
        try:
            while True:
                data = os.read(self._read_fd, 1)
                if not data or data[0] == _END:
                    return
                self._on_signal(signal.Signals(data[0]))
        finally:
            # Forget the write end before closing it, so a late handler cannot write to a file
            # that reuses its number.
            write_fd, self._write_fd = self._write_fd, -1
            os.close(self._read_fd)
            os.close(write_fd)


@contextlib.contextmanager
def relayed(on_signal: Callable[[signal.Signals], None], name: str = "flowengine-signals",
            again: Again = "relay",
            in_handler: Callable[[signal.Signals], None] | None = None) -> Iterator[SignalRelay]:
    """While inside, SIGINT and SIGTERM call ``on_signal`` on a relay thread (see the module and
    :class:`SignalRelay` for the arguments)."""
    relay = SignalRelay(on_signal, name, again, in_handler)
    relay.install()
    try:
        yield relay
    finally:
        relay.restore()
