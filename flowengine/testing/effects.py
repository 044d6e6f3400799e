"""The observed world: side effects a task reports, so a test can see what its flow did.

A task that changes something outside the flow (reserves a seat, charges a card, sends a
mail) can do it through these functions, or through a fake resource built on them, instead of
the real service, in tests::

    from flowengine.testing import effects

    class Charge(task.Task):
        def execute(self, order_id, amount):
            effects.add(f"balance/{order_id}", -amount)
        def revert(self, order_id, amount, result, **kwargs):
            if effects.get(f"refund/{order_id}") is None:   # idempotent: refund once
                effects.add(f"balance/{order_id}", amount)
                effects.put(f"refund/{order_id}", amount)

The world is a set of keys holding JSON values. Every change is a line of the ledger with the
key's value before and after, and the task call it happened in (the kit's interceptor says
which), so a judge can tell a revert that changed nothing from one that did. Which ledger:
the one a :class:`~flowengine.testing.TestKit` (or ``flowengine rehearse``) put in use, else
the file named by the ``FLOWENGINE_TESTING_LEDGER`` environment variable (worker processes),
else one in this process's memory, so the same tasks also run outside tests.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import threading
from typing import Any

from flowengine.testing import ledger as lg

#: Environment variable naming a :class:`~flowengine.testing.ledger.FileLedger` to use.
LEDGER_ENV = "FLOWENGINE_TESTING_LEDGER"


@dataclasses.dataclass(frozen=True)
class CallContext:
    """The task call effects happen in (set by the kit's interceptor around each call)."""

    atom: str
    action: str
    attempt: int
    call: str
    run: str | None
    worker: str | None


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "flowengine_testing_call", default=None)
_lock = threading.Lock()
_in_use: lg.Ledger | None = None
_fallback: lg.Ledger | None = None


def use(ledger: lg.Ledger | None) -> lg.Ledger | None:
    """Send effects to ``ledger`` from now on (None: back to the default); return the one
    used before."""
    global _in_use
    with _lock:
        previous, _in_use = _in_use, ledger
    return previous


def ledger() -> lg.Ledger:
    """The ledger effects go to now (see the module docstring for which)."""
    global _fallback
    found = _in_use
    if found is not None:
        return found
    with _lock:
        if _fallback is None:
            path = os.environ.get(LEDGER_ENV)
            _fallback = lg.FileLedger(path) if path else lg.MemoryLedger()
        return _fallback


def current_call() -> CallContext | None:
    """The task call running in this thread (or coroutine), if the kit's interceptor is on."""
    return _current.get()


def entering(context: CallContext) -> contextvars.Token[CallContext | None]:
    """Mark ``context`` as the running call (the interceptor does); give the token to
    :func:`leaving`."""
    return _current.set(context)


def leaving(token: contextvars.Token[CallContext | None]) -> None:
    """End what :func:`entering` began."""
    _current.reset(token)


def _where() -> dict[str, Any]:
    call = _current.get()
    if call is None:
        return {}
    return {"atom": call.atom, "action": call.action, "attempt": call.attempt,
            "call": call.call, "run": call.run, "worker": call.worker}


def put(key: str, value: Any) -> None:
    """Set ``key`` to ``value`` (a JSON value; None removes it)."""
    ledger().change(key, "put", lambda _before: value, **_where())


def delete(key: str) -> None:
    """Remove ``key`` (nothing happens if it holds nothing)."""
    ledger().change(key, "delete", lambda _before: None, **_where())


def add(key: str, amount: float) -> Any:
    """Add ``amount`` to the number ``key`` holds (0 if nothing); return the new value.

    Raises:
        TypeError: ``key`` holds something other than a number.
    """
    def plus(before: Any) -> Any:
        if before is not None and not isinstance(before, (int, float)):
            raise TypeError(f"effects.add: {key!r} holds {before!r}, not a number")
        return (before or 0) + amount

    return ledger().change(key, "add", plus, **_where()).after


def get(key: str, default: Any = None) -> Any:
    """What ``key`` holds now (``default`` if nothing)."""
    return ledger().state().get(key, default)


def note(what: str, **details: Any) -> None:
    """Record that something happened that changes nothing observable (a log line)."""
    ledger().append(lg.EFFECT, op="note", key=what, details=details, **_where())
