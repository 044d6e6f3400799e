"""Listeners that time an engine's flow and atoms and save the timings in their metadata.

Both take the clock they read as an argument, so that tests can pass time in.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.engines import compiler
from flowengine.listeners import base

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine

__all__ = [
    "FINISHED_STATES",
    "STARTING_STATES",
    "WATCH_STATES",
    "DurationListener",
    "EventTimeListener",
    "PrintingDurationListener",
]

LOG = logging.getLogger(__name__)

#: States that start the clock of a flow or task.
STARTING_STATES: frozenset[str] = frozenset((states.RUNNING, states.REVERTING))
#: States that stop it (and record the duration).
FINISHED_STATES: frozenset[str] = frozenset(base.FINISH_STATES + (states.REVERTED,))
#: Every state :class:`DurationListener` listens for (PENDING discards a running clock).
WATCH_STATES: frozenset[str] = frozenset(
    itertools.chain(FINISHED_STATES, STARTING_STATES, [states.PENDING])
)

Clock = Callable[[], float]


def _printer(message: str) -> None:
    print(message)


class DurationListener(base.Listener):
    """Records how long each task and the flow took to execute (or revert, or fail).

    The duration, in seconds, is saved under the ``'duration'`` key of the task's metadata
    (``storage.update_atom_metadata``) and of the flow's (``storage.update_flow_metadata``).
    Each start (RUNNING or REVERTING) restarts the clock, so after a revert the duration is the
    revert's. Retry controllers are not timed, as in TaskFlow.

    Args:
        engine: The engine to listen to.
        clock: Seconds from a monotonic clock.
    """

    def __init__(self, engine: ActionEngine, *, clock: Clock = time.monotonic) -> None:
        super().__init__(
            engine, task_listen_for=WATCH_STATES, flow_listen_for=WATCH_STATES, retry_listen_for=()
        )
        self._clock = clock
        # The parallel engine may announce states from several threads at once.
        self._lock = threading.Lock()
        self._timers: dict[str, dict[str, float]] = {compiler.TASK: {}, compiler.FLOW: {}}

    def deregister(self) -> None:
        """Stop listening, warning about any task or flow still being timed."""
        super().deregister()
        with self._lock:
            for item_type, timers in self._timers.items():
                if timers:
                    LOG.warning(
                        "%s %s(s) did not enter %s states: %s",
                        len(timers),
                        item_type,
                        sorted(FINISHED_STATES),
                        ", ".join(sorted(timers)),
                    )
                timers.clear()

    def _record_ending(self, elapsed: float, item_type: str, item_name: str, state: str) -> None:
        """Save ``elapsed`` seconds as the flow's or task's ``'duration'`` metadata."""
        meta_update = {"duration": elapsed}
        storage = self._engine.storage
        try:
            if item_type == compiler.FLOW:
                storage.update_flow_metadata(meta_update)
            else:
                storage.update_atom_metadata(item_name, meta_update)
        except exc.StorageFailure:
            # A lost timing is not worth failing the flow for.
            LOG.warning(
                "Failure to store duration update %s for %s %s",
                meta_update,
                item_type,
                item_name,
                exc_info=True,
            )

    def _task_receiver(self, state: str, details: base.Details) -> None:
        self._receiver(compiler.TASK, details["task_name"], state)

    def _flow_receiver(self, state: str, details: base.Details) -> None:
        self._receiver(compiler.FLOW, details["flow_name"], state)

    def _receiver(self, item_type: str, item_name: str, state: str) -> None:
        with self._lock:
            timers = self._timers[item_type]
            if state == states.PENDING:
                timers.pop(item_name, None)
                return
            if state in STARTING_STATES:
                timers[item_name] = self._clock()
                return
            if state not in FINISHED_STATES:
                return
            started = timers.pop(item_name, None)
        if started is not None:
            self._record_ending(self._clock() - started, item_type, item_name, state)


class PrintingDurationListener(DurationListener):
    """A :class:`DurationListener` that also prints when things start and how long they took.

    Args:
        engine: The engine to listen to.
        printer: Called with each message (defaults to :func:`print`).
        clock: Seconds from a monotonic clock.
    """

    def __init__(
        self,
        engine: ActionEngine,
        printer: Callable[[str], Any] | None = None,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(engine, clock=clock)
        self._printer = _printer if printer is None else printer

    def _record_ending(self, elapsed: float, item_type: str, item_name: str, state: str) -> None:
        super()._record_ending(elapsed, item_type, item_name, state)
        self._printer(f"It took {item_type} '{item_name}' {elapsed:0.2f} seconds to finish.")

    def _receiver(self, item_type: str, item_name: str, state: str) -> None:
        super()._receiver(item_type, item_name, state)
        if state in STARTING_STATES:
            self._printer(f"'{item_name}' {item_type} started.")


class EventTimeListener(base.Listener):
    """Records when each flow, task and retry state change happened.

    The time (seconds since the epoch) is saved in the atom's or the flow's metadata under the
    key ``'<STATE>-timestamp'``, e.g. ``'RUNNING-timestamp'``; durations can be derived later.

    Args:
        engine: The engine to listen to.
        task_listen_for: Task states to record.
        flow_listen_for: Flow states to record.
        retry_listen_for: Retry states to record.
        clock: Seconds since the epoch.
    """

    def __init__(
        self,
        engine: ActionEngine,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        *,
        clock: Clock = time.time,
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        self._clock = clock

    def _record_atom_event(self, state: str, atom_name: str) -> None:
        meta_update = {f"{state}-timestamp": self._clock()}
        try:
            self._engine.storage.update_atom_metadata(atom_name, meta_update)
        except exc.StorageFailure:
            # A lost timestamp is not worth failing the flow for.
            LOG.warning(
                "Failure to store timestamp %s for atom %s", meta_update, atom_name, exc_info=True
            )

    def _flow_receiver(self, state: str, details: base.Details) -> None:
        meta_update = {f"{state}-timestamp": self._clock()}
        try:
            self._engine.storage.update_flow_metadata(meta_update)
        except exc.StorageFailure:
            LOG.warning(
                "Failure to store timestamp %s for flow %s",
                meta_update,
                details["flow_name"],
                exc_info=True,
            )

    def _task_receiver(self, state: str, details: base.Details) -> None:
        self._record_atom_event(state, details["task_name"])

    def _retry_receiver(self, state: str, details: base.Details) -> None:
        self._record_atom_event(state, details["retry_name"])
