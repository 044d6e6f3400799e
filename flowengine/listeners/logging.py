"""Listeners that write an engine's flow and task state changes to a :mod:`logging` logger.

Both only log through the logger they are given (by default this module's); they never
configure logging.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from flowengine import states
from flowengine.atom import Atom
from flowengine.formatters import AtomMatcher, FailureFormatter
from flowengine.listeners import base
from flowengine.task import Task
from flowengine.types.failure import Failure

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine

__all__ = ["DynamicLoggingListener", "FailureFormatterLike", "LoggingListener"]

LOG = logging.getLogger(__name__)


class FailureFormatterLike(Protocol):
    """What :class:`DynamicLoggingListener` needs of its ``fail_formatter``."""

    def format(self, fail: Failure, atom_matcher: AtomMatcher) -> tuple[Any, str]:
        """Return ``(exc_info, details)`` for a failure (see :class:`FailureFormatter`)."""
        ...


def _pick_logger(*candidates: logging.Logger | None) -> logging.Logger:
    for candidate in candidates:
        if candidate is not None:
            return candidate
    return LOG


class LoggingListener(base.DumpingListener):
    """Logs every flow and task state change at one level.

    Args:
        engine: The engine to listen to.
        task_listen_for: Task states to log.
        flow_listen_for: Flow states to log.
        retry_listen_for: Retry states to listen for (retry changes are not logged).
        log: The logger to use; defaults to the class attribute ``_LOGGER``, then to this
            module's logger (``flowengine.listeners.logging``).
        level: The level every message is logged at.
    """

    #: The logger used when none is given to the constructor (None: this module's).
    _LOGGER: ClassVar[logging.Logger | None] = None

    def __init__(
        self,
        engine: ActionEngine,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        log: logging.Logger | None = None,
        level: int = logging.DEBUG,
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        self._logger = _pick_logger(log, self._LOGGER)
        self._level = level

    def _dump(self, message: str, *args: Any, **kwargs: Any) -> None:
        self._logger.log(self._level, message, *args, **kwargs)


def _make_matcher(task_name: str) -> Callable[[Atom], bool]:
    """A matcher that finds the task called ``task_name``."""

    def _matches(atom: Atom) -> bool:
        return isinstance(atom, Task) and atom.name == task_name

    return _matches


class DynamicLoggingListener(base.Listener):
    """Logs flow and task state changes, choosing the level from the state and the result.

    Flow states FAILURE and REVERTED, and task states FAILURE, REVERTED, RETRYING and
    REVERT_FAILURE, are logged at ``failure_level``; everything else at ``level``. A task that
    finishes with a :class:`~flowengine.types.failure.Failure` is always logged at
    ``failure_level``, with its traceback and the details ``fail_formatter`` gives (by default
    the atoms that ran before it, with their inputs and outputs). Results of successful tasks
    are shown only when ``level`` is enabled on the logger, and never for the tasks named in
    ``hide_inputs_outputs_of``. Retry state changes are not logged.

    Args:
        engine: The engine to listen to.
        task_listen_for: Task states to log.
        flow_listen_for: Flow states to log.
        retry_listen_for: Retry states to listen for (retry changes are not logged).
        log: The logger to use; defaults to the class attribute ``_LOGGER``, then to this
            module's logger.
        failure_level: The level of failure-related messages.
        level: The level of every other message.
        hide_inputs_outputs_of: Names of atoms whose arguments and results are never shown.
        fail_formatter: Formats failures; defaults to a
            :class:`~flowengine.formatters.FailureFormatter` built from the other arguments.
        mask_inputs_keys: Keys whose values are shown as ``***`` in atoms' arguments.
        mask_outputs_keys: Keys whose values are shown as ``***`` in atoms' results.
    """

    #: The logger used when none is given to the constructor (None: this module's).
    _LOGGER: ClassVar[logging.Logger | None] = None

    #: States which are triggered under some type of failure.
    _FAILURE_STATES: ClassVar[tuple[str, ...]] = (states.FAILURE, states.REVERT_FAILURE)

    def __init__(
        self,
        engine: ActionEngine,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        log: logging.Logger | None = None,
        failure_level: int = logging.WARNING,
        level: int = logging.DEBUG,
        hide_inputs_outputs_of: Iterable[str] = (),
        fail_formatter: FailureFormatterLike | None = None,
        mask_inputs_keys: Iterable[str] = (),
        mask_outputs_keys: Iterable[str] = (),
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        self._failure_level = failure_level
        self._level = level
        self._task_log_levels = {
            states.FAILURE: failure_level,
            states.REVERTED: failure_level,
            states.RETRYING: failure_level,
            states.REVERT_FAILURE: failure_level,
        }
        self._flow_log_levels = {
            states.FAILURE: failure_level,
            states.REVERTED: failure_level,
        }
        self._hide_inputs_outputs_of = frozenset(hide_inputs_outputs_of)
        self._logger = _pick_logger(log, self._LOGGER)
        self._fail_formatter: FailureFormatterLike
        if fail_formatter is None:
            self._fail_formatter = FailureFormatter(
                engine,
                hide_inputs_outputs_of=self._hide_inputs_outputs_of,
                mask_inputs_keys=mask_inputs_keys,
                mask_outputs_keys=mask_outputs_keys,
            )
        else:
            self._fail_formatter = fail_formatter

    def _flow_receiver(self, state: str, details: base.Details) -> None:
        self._logger.log(
            self._flow_log_levels.get(state, self._level),
            "Flow '%s' (%s) transitioned into state '%s' from state '%s'",
            details["flow_name"],
            details["flow_uuid"],
            state,
            details.get("old_state"),
        )

    def _task_receiver(self, state: str, details: base.Details) -> None:
        name, uuid, old_state = details["task_name"], details["task_uuid"], details["old_state"]
        transition = "Task '%s' (%s) transitioned into state '%s' from state '%s'"
        if "result" not in details or state not in base.FINISH_STATES:
            level = self._task_log_levels.get(state, self._level)
            self._logger.log(level, transition, name, uuid, state, old_state)
            return
        result = details["result"]
        if isinstance(result, Failure):
            exc_info, fail_details = self._fail_formatter.format(result, _make_matcher(name))
            if fail_details:
                self._logger.log(
                    self._failure_level,
                    transition + "%s%s",
                    name,
                    uuid,
                    state,
                    old_state,
                    os.linesep,
                    fail_details,
                    exc_info=exc_info,
                )
            else:
                self._logger.log(
                    self._failure_level,
                    transition,
                    name,
                    uuid,
                    state,
                    old_state,
                    exc_info=exc_info,
                )
            return
        level = self._task_log_levels.get(state, self._level)
        # Results can be large or sensitive: only render them when the logger would emit them.
        show_result = self._logger.isEnabledFor(self._level) or state == states.FAILURE
        if show_result and name not in self._hide_inputs_outputs_of:
            self._logger.log(
                level, transition + " with result '%s'", name, uuid, state, old_state, result
            )
        else:
            self._logger.log(level, transition, name, uuid, state, old_state)
