"""The atom log: one INFO line per atom state change, on the ``flowengine.atoms`` logger.

Every engine attaches an :class:`AtomLogListener` while it runs, through the
:class:`AtomLogHook` among the process's default hooks (see :mod:`flowengine.hooks`). The line
names the flow, the atom, the change, the attempt and worker (for atoms that ran remotely) and,
when the atom finished, how long it took; a failure adds its type and message, with the atom's
secret arguments and URL passwords masked. The library never configures logging: with no
handler or level set for ``flowengine.atoms`` the line goes where the application's logging
sends INFO.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from flowengine import hooks, states
from flowengine.listeners import base
from flowengine.persistence.backends._uri import mask_urls
from flowengine.types.failure import Failure

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine

__all__ = ["LOGGER_NAME", "AtomLogHook", "AtomLogListener", "Placement", "redacted_failure"]

#: The logger the atom log is written to.
LOGGER_NAME = "flowengine.atoms"
LOG = logging.getLogger(LOGGER_NAME)

#: States that start an atom's clock, and those that stop it.
STARTING_STATES = frozenset({states.RUNNING, states.REVERTING})
FINISHED_STATES = frozenset(base.FINISH_STATES)


class Placement(Protocol):
    """What engines that run atoms elsewhere provide: ``(attempt, worker)`` of an atom uuid."""

    def __call__(self, atom_uuid: str) -> tuple[int | None, str | None]:
        """The atom's current attempt number and worker id (None where unknown)."""
        ...


def redacted_failure(engine: ActionEngine, atom_name: str, failure: Failure) -> Failure:
    """``failure`` with the flow's secrets (``Secret`` store values, the atoms' secret
    arguments) masked: failures from TaskFlow workers, or built by the engine, were never
    redacted by the executor."""
    masked: Failure = engine.storage.masked(failure)
    return masked


def _value(text: object) -> str:
    value = str(text)
    if not value or any(c.isspace() or c in '"=' for c in value):
        return json.dumps(value)
    return value


class AtomLogListener(base.Listener):
    """Logs every task and retry state change as one line (see the module docstring).

    Args:
        engine: The engine to listen to.
        log: The logger (default ``flowengine.atoms``).
        level: The level of every line.
        clock: Monotonic seconds, for durations.
    """

    def __init__(self, engine: ActionEngine, *, log: logging.Logger | None = None,
                 level: int = logging.INFO, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(engine, flow_listen_for=())
        self._log = LOG if log is None else log
        self._level, self._clock = level, clock
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()

    def _task_receiver(self, state: str, details: base.Details) -> None:
        self._line(state, details, details["task_name"], details["task_uuid"])

    def _retry_receiver(self, state: str, details: base.Details) -> None:
        self._line(state, details, details["retry_name"], details["retry_uuid"])

    def _line(self, state: str, details: base.Details, name: str, atom_uuid: str) -> None:
        if not self._log.isEnabledFor(self._level):
            return
        with self._lock:
            if state in STARTING_STATES:
                self._started[atom_uuid] = self._clock()
                started = None
            else:
                started = self._started.pop(atom_uuid, None)
        storage = self._engine.storage
        placement: Placement | None = getattr(self._engine, "atom_placement", None)
        attempt, worker = placement(atom_uuid) if placement is not None else (1, "local")
        parts = [f"atom={_value(name)}", f"state={state}",
                 f"from={details.get('old_state')}", f"flow={_value(storage.flow_name)}",
                 f"flow_uuid={storage.flow_uuid}", f"atom_uuid={atom_uuid}",
                 f"attempt={attempt if attempt is not None else '-'}",
                 f"worker={_value(worker or '-')}"]
        duration = None
        if started is not None and state in FINISHED_STATES:
            duration = self._clock() - started
            parts.append(f"duration={duration:.3f}s")
        result = details.get("result")
        if isinstance(result, Failure):
            failure = redacted_failure(self._engine, name, result)
            kind = failure.exc_type_names[0] if failure.exc_type_names else "?"
            parts.append(f"error={_value(kind + ': ' + mask_urls(failure.exception_str))}")
        self._log.log(self._level, storage.masker.text(" ".join(parts)), extra={
            "flow_uuid": storage.flow_uuid, "atom": name, "atom_uuid": atom_uuid,
            "atom_state": state, "attempt": attempt, "worker": worker, "duration": duration})


class AtomLogHook(hooks.Hook):
    """Attaches an :class:`AtomLogListener` to each run of an engine (one of the process's
    default hooks: see :mod:`flowengine.hooks`)."""

    def run(self, engine: ActionEngine) -> AtomLogListener:
        return AtomLogListener(engine)
