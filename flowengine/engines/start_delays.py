"""A task's ``start_delay``: how long each of its executions waits after the task is ready.

Local engines hold the wait themselves: the task stays ``PENDING`` with its due time stored
(task metadata ``delayed_until``) while a timer runs, then starts. A worker-based engine sends
the request at once as a delayed dispatch (doc/priorities.rst), after whatever retry wait the
request already carries. Either way the wait is announced like a retry's (``task-delayed``
and ``task-delay-ended`` events, ``kind`` ``task``) and a resumed engine waits only what is
left of it.
"""

from __future__ import annotations

import concurrent.futures as cf
import weakref
from collections.abc import Callable

from flowengine import states
from flowengine.atom import Atom
from flowengine.engines.actions import META_DELAYED_UNTIL, atom_meta
from flowengine.engines.compiler import Compilation
from flowengine.engines.delays import RetryWait, RetryWaits
from flowengine.storage import Storage
from flowengine.task import Task


def start_delay(task: Atom) -> float:
    """``task``'s ``start_delay`` in seconds (0 for a retry controller, which has none)."""
    return max(0.0, float(task.start_delay or 0.0)) if isinstance(task, Task) else 0.0


class StartDelays:
    """The start delays of one engine's tasks.

    Args:
        storage: the flow's storage (due times are stored in task metadata).
        waits: who hears when a wait starts and ends.
        clock: seconds since the epoch (the engine's ``retry_clock`` in tests).
        compilation: the flow's compilation (a task's retry controllers).

    Attributes:
        delayed: futures of requests sent with a delay (a worker-based engine's), which a
            suspension takes back at once rather than waiting the delay out.
    """

    def __init__(self, storage: Storage, waits: RetryWaits, clock: Callable[[], float],
                 compilation: Compilation) -> None:
        self._storage = storage
        self._waits = waits
        self._clock = clock
        self._compilation = compilation
        self.delayed: weakref.WeakSet[cf.Future] = weakref.WeakSet()
        #: Tasks whose local wait is over: their next scheduling starts them.
        self._elapsed: set[str] = set()
        #: Tasks whose wait this engine announced and has not announced the end of.
        self._announced: set[str] = set()
        #: Waits worked out but not yet announced: announced once armed (see :meth:`armed`).
        self._unarmed: dict[str, RetryWait] = {}

    def local_wait(self, task: Atom) -> float:
        """Seconds ``task`` must still wait before this execution on a local engine (0: start
        now). The wait's due time is stored when it starts, and announced by :meth:`armed`."""
        seconds = start_delay(task)
        if seconds <= 0:
            return 0.0
        if task.name in self._elapsed:
            self._elapsed.discard(task.name)
            self.ended(task)
            return 0.0
        due = self._stored_due(task)
        now = self._clock()
        if due is None:
            due = now + seconds
            self._storage.update_atom_metadata(task.name, {META_DELAYED_UNTIL: due})
        # Bounded: a wall clock set back while the flow was suspended must not stretch it.
        left = max(0.0, min(due - now, seconds))
        if left <= 0:
            self.ended(task)
            return 0.0
        self._to_announce(task, due, left)
        return left

    def elapsed(self, task: Atom) -> None:
        """``task``'s local wait is over: the next time it is scheduled it starts."""
        self._elapsed.add(task.name)

    def carried(self, task: Atom, due: float | None, delay: float) -> tuple[float | None, float]:
        """What a worker-based engine's request for ``task`` carries: ``(due, delay)`` of the
        retry waits it carries already, lengthened by the task's own start delay (counted
        from when those end). A resumed run keeps the due time it stored. A wait is
        announced by :meth:`armed`."""
        seconds = start_delay(task)
        if seconds <= 0:
            return due, delay
        now = self._clock()
        stored = self._stored_due(task)
        if stored is not None and self._storage.get_atom_state(task.name) == states.RUNNING:
            own_due = stored  # sent before this engine (re)started: the wait goes on
        else:
            own_due = (due if due is not None and delay > 0 else now) + seconds
        left = max(0.0, min(own_due - now, delay + seconds))
        if left <= 0:
            return due, delay
        self._to_announce(task, own_due, left)
        return (own_due, left) if left > delay else (due, delay)

    def armed(self, task: Atom) -> None:
        """``task``'s wait is armed (its timer set, its request sent or held): announce it.

        Announcing only now means whoever hears of a wait may move the clock it is due by
        (tests do) without the wait being armed afterwards, from the moved clock.
        """
        wait = self._unarmed.pop(task.name, None)
        if wait is not None:
            self._announced.add(task.name)
            self._waits.announce(wait)

    def ended(self, task: Atom) -> None:
        """Announce the end of ``task``'s wait, if this engine announced its start (a wait
        never armed was never announced, and ends unheard)."""
        self._unarmed.pop(task.name, None)
        if task.name in self._announced:
            self._announced.discard(task.name)
            self._waits.announce(RetryWait(task.name, self._attempt_of(task), None, 0.0,
                                           kind="task"))

    def forget(self) -> None:
        """A new run: nothing announced or elapsed carries over (stored due times do)."""
        self._elapsed.clear()
        self._announced.clear()
        self._unarmed.clear()

    def take_back_delayed(self) -> None:
        """A suspension: cancel the requests still waiting out a delay (a request a worker
        already took is not cancelled: it runs), so the engine does not wait for them."""
        for future in list(self.delayed):
            future.cancel()

    def _attempt_of(self, task: Atom) -> int:
        """The attempt of ``task``'s innermost retry controller (1 without one)."""
        retries = self._compilation.retries_around(task)
        if not retries:
            return 1
        return max(1, len(self._storage.get_retry_history(retries[-1].name)))

    def _to_announce(self, task: Atom, due: float, left: float) -> None:
        """Keep ``task``'s wait for :meth:`armed` to announce (unless it is announced already)."""
        if task.name not in self._announced and task.name not in self._unarmed:
            self._unarmed[task.name] = RetryWait(task.name, self._attempt_of(task), due, left,
                                                 kind="task")

    def _stored_due(self, task: Atom) -> float | None:
        due = atom_meta(self._storage, task.name).get(META_DELAYED_UNTIL)
        return float(due) if isinstance(due, int | float) and not isinstance(due, bool) else None
