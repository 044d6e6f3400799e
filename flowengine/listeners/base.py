"""The listener base classes: objects that attach to an engine and react to its state changes.

A listener registers callbacks on an engine's two notifiers: ``engine.notifier`` (flow state
changes) and ``engine.atom_notifier`` (task and retry state changes, told apart by the keys of
their details). Subclasses override :meth:`Listener._flow_receiver`,
:meth:`Listener._task_receiver` and/or :meth:`Listener._retry_receiver`.

Unlike TaskFlow's, a receiver that raises is logged here, naming the listener, the flow or atom
and the state, and the engine carries on; the engine's own notifier would also swallow it, but
only with a generic message.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from flowengine import states
from flowengine.types.failure import Failure
from flowengine.types.notifier import Notifier

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine

__all__ = ["DEFAULT_LISTEN_FOR", "FINISH_STATES", "DumpingListener", "Listener"]

LOG = logging.getLogger(__name__)

#: States whose notifications carry a result (the others produce none).
FINISH_STATES: tuple[str, ...] = (
    states.FAILURE,
    states.SUCCESS,
    states.REVERTED,
    states.REVERT_FAILURE,
)

#: What a listener listens for unless told otherwise: every state.
DEFAULT_LISTEN_FOR: tuple[str, ...] = (Notifier.ANY,)

Details = dict[str, Any]
Receiver = Callable[[str, Details], None]
DetailsFilter = Callable[[Details], bool]

_TASK, _RETRY, _FLOW = "task", "retry", "flow"

# typing.Self needs Python 3.11 and the package supports 3.10.
_ListenerT = TypeVar("_ListenerT", bound="Listener")


def _task_matcher(details: Details) -> bool:
    """Tell whether atom-notifier details describe a task."""
    return bool(details) and "task_name" in details and "task_uuid" in details


def _retry_matcher(details: Details) -> bool:
    """Tell whether atom-notifier details describe a retry controller."""
    return bool(details) and "retry_name" in details and "retry_uuid" in details


def _states_tuple(listen_for: Iterable[str] | None) -> tuple[str, ...]:
    """The states to listen for; one state given as a bare string is one state, not letters."""
    if not listen_for:
        return ()
    if isinstance(listen_for, str):
        return (listen_for,)
    return tuple(listen_for)


def _bulk_deregister(
    notifier: Notifier,
    registered: list[tuple[str, Receiver]],
    details_filter: DetailsFilter | None = None,
) -> None:
    """Deregister every ``(state, callback)`` pair, emptying ``registered``."""
    while registered:
        state, callback = registered.pop()
        notifier.deregister(state, callback, details_filter=details_filter)


def _bulk_register(
    watch_states: Iterable[str],
    notifier: Notifier,
    callback: Receiver,
    details_filter: DetailsFilter | None = None,
) -> list[tuple[str, Receiver]]:
    """Register ``callback`` for each state; all or nothing.

    Raises:
        ValueError: if the notifier refuses one of the states (those already registered by this
            call are deregistered first).
    """
    registered: list[tuple[str, Receiver]] = []
    try:
        for state in watch_states:
            if not notifier.is_registered(state, callback, details_filter=details_filter):
                notifier.register(state, callback, details_filter=details_filter)
                registered.append((state, callback))
    except ValueError:
        _bulk_deregister(notifier, registered, details_filter=details_filter)
        raise
    return registered


class Listener:
    """Base class for listeners: attach to an engine, react to flow, task and retry states.

    Use it as a context manager to register on entry and deregister on exit (even when the run
    raised), or call :meth:`register` and :meth:`deregister` yourself.

    Args:
        engine: The engine whose notifications to receive.
        task_listen_for: Task states to receive (``Notifier.ANY`` for all; empty for none).
        flow_listen_for: Flow states to receive.
        retry_listen_for: Retry controller states to receive.
    """

    def __init__(
        self,
        engine: ActionEngine,
        task_listen_for: Iterable[str] | None = DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = DEFAULT_LISTEN_FOR,
    ) -> None:
        self._engine = engine
        self._listen_for: dict[str, tuple[str, ...]] = {
            _TASK: _states_tuple(task_listen_for),
            _RETRY: _states_tuple(retry_listen_for),
            _FLOW: _states_tuple(flow_listen_for),
        }
        self._registered: dict[str, list[tuple[str, Receiver]]] = {}

    # -- hooks for subclasses -----------------------------------------------------------------

    def _flow_receiver(self, state: str, details: Details) -> None:
        """Called when the flow changes state (details: flow_name, flow_uuid, old_state)."""

    def _task_receiver(self, state: str, details: Details) -> None:
        """Called when a task changes state (details: task_name, task_uuid, old_state, result)."""

    def _retry_receiver(self, state: str, details: Details) -> None:
        """Called when a retry changes state (details: retry_name, retry_uuid, old_state, ...)."""

    # -- isolation: these are what the notifiers call -----------------------------------------

    def _deliver(self, receiver: Receiver, kind: str, state: str, details: Details) -> None:
        try:
            receiver(state, details)
        except Exception:
            LOG.warning(
                "Listener %s failed handling %s %r moving into state '%s'; ignoring it",
                type(self).__name__,
                kind,
                details.get(f"{kind}_name"),
                state,
                exc_info=True,
            )

    def _on_flow(self, state: str, details: Details) -> None:
        # The hook is looked up on every call so that it can be replaced after registering.
        self._deliver(self._flow_receiver, _FLOW, state, details)

    def _on_task(self, state: str, details: Details) -> None:
        self._deliver(self._task_receiver, _TASK, state, details)

    def _on_retry(self, state: str, details: Details) -> None:
        self._deliver(self._retry_receiver, _RETRY, state, details)

    def _channel(self, kind: str) -> tuple[Notifier, Receiver, DetailsFilter | None]:
        """The notifier, callback and details filter used for one kind of event."""
        if kind == _TASK:
            return self._engine.atom_notifier, self._on_task, _task_matcher
        if kind == _RETRY:
            return self._engine.atom_notifier, self._on_retry, _retry_matcher
        return self._engine.notifier, self._on_flow, None

    # -- registration -------------------------------------------------------------------------

    def register(self) -> None:
        """Start receiving notifications (registering twice is harmless).

        Raises:
            ValueError: if a notifier refuses one of the states listened for.
        """
        for kind in (_TASK, _RETRY, _FLOW):
            if kind not in self._registered:
                notifier, callback, details_filter = self._channel(kind)
                self._registered[kind] = _bulk_register(
                    self._listen_for[kind], notifier, callback, details_filter=details_filter
                )

    def deregister(self) -> None:
        """Stop receiving notifications (deregistering when not registered is harmless)."""
        for kind in (_TASK, _RETRY, _FLOW):
            registered = self._registered.pop(kind, None)
            if registered:
                notifier, _callback, details_filter = self._channel(kind)
                _bulk_deregister(notifier, registered, details_filter=details_filter)

    def __enter__(self: _ListenerT) -> _ListenerT:
        self.register()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.deregister()
        except Exception:
            # Raising here would hide the exception (if any) the run itself raised.
            LOG.warning(
                "Listener %s failed deregistering from engine %s",
                type(self).__name__,
                self._engine,
                exc_info=True,
            )


class DumpingListener(Listener, metaclass=abc.ABCMeta):
    """Base class for listeners that write flow and task state changes somewhere as text.

    Subclasses implement :meth:`_dump`; the messages are TaskFlow's. Retry state changes are not
    dumped.
    """

    @abc.abstractmethod
    def _dump(self, message: str, *args: Any, **kwargs: Any) -> None:
        """Write ``message % args`` out.

        Args:
            message: A ``%``-style template.
            *args: The template's values.
            **kwargs: ``exc_info``: a ``(type, value, traceback)`` tuple to write too, or None.
        """

    def _flow_receiver(self, state: str, details: Details) -> None:
        self._dump(
            "%s has moved flow '%s' (%s) into state '%s' from state '%s'",
            self._engine,
            details["flow_name"],
            details["flow_uuid"],
            state,
            details["old_state"],
        )

    def _task_receiver(self, state: str, details: Details) -> None:
        if state not in FINISH_STATES:
            self._dump(
                "%s has moved task '%s' (%s) into state '%s' from state '%s'",
                self._engine,
                details["task_name"],
                details["task_uuid"],
                state,
                details["old_state"],
            )
            return
        result = details.get("result")
        exc_info = None
        was_failure = isinstance(result, Failure)
        if isinstance(result, Failure) and result.exc_info:
            exc_info = tuple(result.exc_info)
        self._dump(
            "%s has moved task '%s' (%s) into state '%s' from state '%s' with result '%s'"
            " (failure=%s)",
            self._engine,
            details["task_name"],
            details["task_uuid"],
            state,
            details["old_state"],
            result,
            was_failure,
            exc_info=exc_info,
        )
