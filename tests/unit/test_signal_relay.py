"""The command-line tools' signal handlers only pass signals on, so they cannot deadlock.

A Python handler runs in the main thread wherever it was interrupted. The old handlers started a
thread and wrote to stderr from inside the handler, which can need what the interrupted main
thread holds (a stream's buffer raises "reentrant call", a plain lock waits for ever).
"""

from __future__ import annotations

import signal
import threading

import pytest

from flowengine.cli.signal_relay import SignalRelay, relayed


def test_a_signal_is_acted_on_by_the_relay_thread_not_the_handler() -> None:
    acted = threading.Event()
    where: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        where.append(f"{sig.name} on {threading.current_thread().name}")
        acted.set()

    with relayed(on_signal, "relay-under-test") as relay:
        signal.raise_signal(signal.SIGTERM)
        assert acted.wait(10)
        assert relay.received
    assert where == ["SIGTERM on relay-under-test"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(
        signal.getsignal(signal.SIGTERM))


def test_a_signal_while_the_main_thread_holds_a_lock_the_action_needs_does_not_deadlock() -> None:
    # What the main thread may hold when a signal lands: a logging handler's lock, a stream's
    # buffer, a pool's lock. An action run inside the handler would wait for it for ever.
    held = threading.Lock()
    acted = threading.Event()

    def on_signal(_sig: signal.Signals) -> None:
        with held:
            acted.set()

    with relayed(on_signal, "relay-under-test"):
        with held:
            signal.raise_signal(signal.SIGTERM)  # returns: the handler needs no lock
            assert not acted.is_set()
        assert acted.wait(10)


def test_again_exit_raises_system_exit_at_the_second_signal() -> None:
    relay = SignalRelay(lambda _sig: None, "relay-under-test", again="exit")
    relay.install()
    try:
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
    finally:
        relay.restore()


def test_again_restore_gives_the_second_sigint_its_usual_keyboard_interrupt() -> None:
    acted = threading.Event()
    with relayed(lambda _sig: acted.set(), "relay-under-test", again="restore"):
        signal.raise_signal(signal.SIGINT)
        assert acted.wait(10)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_the_relay_thread_ends_at_restore() -> None:
    relay = SignalRelay(lambda _sig: None, "relay-ending")
    relay.install()
    relay.restore()
    assert not any(t.name == "relay-ending" for t in threading.enumerate())
