"""Publish/subscribe of engine, flow and atom events to registered callbacks.

Same API and call convention as TaskFlow's notifier: a callback registered with ``args`` and
``kwargs`` is called as ``callback(event_type, *args, details=details, **kwargs)``, where
``details`` is a fresh copy of the dict given to :meth:`Notifier.notify`.

Unlike TaskFlow's, registration is thread-safe (a lock guards the listener table and
:meth:`Notifier.notify` iterates over a snapshot), so listeners may be added or removed while an
engine running on other threads is notifying.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = ["Listener", "Notifier", "RestrictedNotifier", "register_deregister"]

LOG = logging.getLogger(__name__)

Callback = Callable[..., Any]
DetailsFilter = Callable[[dict[str, Any]], Any]


def _same_callback(a: Callable[..., Any] | None, b: Callable[..., Any] | None) -> bool:
    # Bound methods are re-created on every attribute access, so identity alone is not enough;
    # since Python 3.8 their equality compares the bound object by identity, which is what we want.
    return a is b or (a is not None and b is not None and a == b)


def _callback_name(callback: Callable[..., Any]) -> str:
    name = getattr(callback, "__qualname__", None) or getattr(callback, "__name__", None)
    return str(name) if name else repr(callback)


class Listener:
    """An immutable callback target: the callback, its extra arguments and a details filter.

    Args:
        callback: Called as ``callback(event_type, *args, details=details, **kwargs)``.
        args: Extra positional arguments.
        kwargs: Extra keyword arguments (must not contain ``details``).
        details_filter: Called with the details first; a falsey result skips the callback.
    """

    def __init__(
        self,
        callback: Callback,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        details_filter: DetailsFilter | None = None,
    ) -> None:
        self._callback = callback
        self._details_filter = details_filter
        self._args: tuple[Any, ...] = tuple(args) if args else ()
        self._kwargs: dict[str, Any] = dict(kwargs) if kwargs else {}

    @property
    def callback(self) -> Callback:
        """The callback called with the event type and details."""
        return self._callback

    @property
    def details_filter(self) -> DetailsFilter | None:
        """The filter that can discard an event before the callback sees it, or ``None``."""
        return self._details_filter

    @property
    def args(self) -> tuple[Any, ...]:
        """Extra positional arguments passed to the callback."""
        return self._args

    @property
    def kwargs(self) -> dict[str, Any]:
        """A copy of the extra keyword arguments passed to the callback."""
        return dict(self._kwargs)

    def __call__(self, event_type: str, details: dict[str, Any]) -> None:
        """Call the callback with ``event_type`` and ``details`` unless the filter rejects them."""
        if self._details_filter is not None and not self._details_filter(details):
            return
        self._callback(event_type, *self._args, details=details, **self._kwargs)

    def is_equivalent(
        self, callback: Callback, details_filter: DetailsFilter | None = None
    ) -> bool:
        """Tell whether this listener wraps ``callback`` with the same ``details_filter``.

        Args:
            callback: The callback to compare with.
            details_filter: The details filter to compare with (``None`` matches only ``None``).

        Returns:
            ``True`` if both are the same.
        """
        if not _same_callback(self._callback, callback):
            return False
        if details_filter is None or self._details_filter is None:
            return details_filter is None and self._details_filter is None
        return _same_callback(self._details_filter, details_filter)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Listener):
            return NotImplemented
        return self.is_equivalent(other._callback, details_filter=other._details_filter)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # type: ignore[assignment]  # equality is by callback, not identity

    def __repr__(self) -> str:
        text = f"<Listener calling {self._callback!r}"
        if self._details_filter is not None:
            text += f" filtered by {self._details_filter!r}"
        return text + ">"


class Notifier:
    """Calls the callbacks registered for an event type (or for :attr:`ANY`) when it is notified.

    A callback that raises is logged with the event type and the callback's name and otherwise
    ignored: it never stops :meth:`notify` or the other callbacks.
    """

    #: Keys a callback's ``kwargs`` may not use (the notifier passes them itself).
    RESERVED_KEYS: tuple[str, ...] = ("details",)

    #: Event type whose callbacks receive every event.
    ANY = "*"

    #: Event types that cannot be notified.
    _DISALLOWED_NOTIFICATION_EVENTS: frozenset[str] = frozenset({ANY})

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._topics: dict[str, list[Listener]] = {}

    def __len__(self) -> int:
        """Return how many callbacks are registered, over all event types."""
        with self._lock:
            return sum(len(listeners) for listeners in self._topics.values())

    def is_registered(
        self, event_type: str, callback: Callback, details_filter: DetailsFilter | None = None
    ) -> bool:
        """Tell whether ``callback`` (with ``details_filter``) is registered for ``event_type``."""
        with self._lock:
            return any(
                listener.is_equivalent(callback, details_filter=details_filter)
                for listener in self._topics.get(event_type, ())
            )

    def reset(self) -> None:
        """Forget every registered callback."""
        with self._lock:
            self._topics.clear()

    def notify(self, event_type: str, details: Mapping[str, Any] | None) -> None:
        """Call every callback registered for ``event_type`` and for :attr:`ANY`.

        :attr:`ANY` callbacks run first. Each callback receives its own shallow copy of
        ``details``. An event type that :meth:`can_trigger_notification` refuses is dropped.

        Args:
            event_type: The event that occurred.
            details: Data about the event (``None`` is sent as ``{}``).
        """
        if not self.can_trigger_notification(event_type):
            LOG.debug("Event type '%s' is not allowed to trigger notifications", event_type)
            return
        with self._lock:
            listeners = list(self._topics.get(self.ANY, ()))
            listeners.extend(self._topics.get(event_type, ()))
        base = dict(details) if details else {}
        for listener in listeners:
            try:
                listener(event_type, dict(base))
            except Exception:
                LOG.warning(
                    "Callback %s raised while handling event '%s'; ignoring it",
                    _callback_name(listener.callback),
                    event_type,
                    exc_info=True,
                )

    def register(
        self,
        event_type: str,
        callback: Callback,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        details_filter: DetailsFilter | None = None,
    ) -> None:
        """Register ``callback`` for ``event_type`` (or for every event with :attr:`ANY`).

        Args:
            event_type: The event type to listen to.
            callback: Called as ``callback(event_type, *args, details=details, **kwargs)``.
            args: Extra positional arguments for the callback.
            kwargs: Extra keyword arguments for the callback.
            details_filter: Called with the details first; a falsey result skips the callback.

        Raises:
            ValueError: If the callback or filter is not callable, the event type cannot be
                registered, or an equivalent callback is already registered for it.
            KeyError: If ``kwargs`` uses a reserved key.
        """
        if not callable(callback):
            raise ValueError(f"Callback {callback!r} for event '{event_type}' is not callable")
        if details_filter is not None and not callable(details_filter):
            raise ValueError(
                f"Details filter {details_filter!r} for event '{event_type}' is not callable"
            )
        if not self.can_be_registered(event_type):
            raise ValueError(f"Disallowed event type '{event_type}' can not have a callback")
        for key in self.RESERVED_KEYS:
            if kwargs and key in kwargs:
                raise KeyError(f"Reserved key '{key}' not allowed in kwargs of a callback")
        listener = Listener(callback, args=args, kwargs=kwargs, details_filter=details_filter)
        with self._lock:
            if self.is_registered(event_type, callback, details_filter=details_filter):
                raise ValueError(
                    f"Callback {_callback_name(callback)} is already registered for event"
                    f" '{event_type}' with an equivalent details filter"
                )
            self._topics.setdefault(event_type, []).append(listener)

    def deregister(
        self, event_type: str, callback: Callback, details_filter: DetailsFilter | None = None
    ) -> bool:
        """Remove one callback registered for ``event_type``.

        Returns:
            ``True`` if a callback was removed.
        """
        with self._lock:
            listeners = self._topics.get(event_type, [])
            for i, listener in enumerate(listeners):
                if listener.is_equivalent(callback, details_filter=details_filter):
                    del listeners[i]
                    if not listeners:
                        del self._topics[event_type]
                    return True
        return False

    def deregister_event(self, event_type: str) -> int:
        """Remove every callback registered for ``event_type``.

        Returns:
            How many callbacks were removed.
        """
        with self._lock:
            return len(self._topics.pop(event_type, []))

    def copy(self) -> Notifier:
        """Return a notifier of the same class with the same registrations."""
        clone = self.__class__.__new__(self.__class__)
        clone.__dict__.update(self.__dict__)
        clone._lock = threading.RLock()
        with self._lock:
            clone._topics = {event: list(listeners) for event, listeners in self._topics.items()}
        return clone

    def listeners_iter(self) -> Iterator[tuple[str, list[Listener]]]:
        """Yield ``(event_type, listeners)`` for every event type that has callbacks.

        The lists are snapshots: changing registrations while iterating is safe.
        """
        with self._lock:
            snapshot = [(event, list(ls)) for event, ls in self._topics.items() if ls]
        yield from snapshot

    def can_be_registered(self, event_type: str) -> bool:
        """Tell whether callbacks may be registered for ``event_type`` (always, here)."""
        return True

    def can_trigger_notification(self, event_type: str) -> bool:
        """Tell whether ``event_type`` may be notified (anything but :attr:`ANY`)."""
        return event_type not in self._DISALLOWED_NOTIFICATION_EVENTS


class RestrictedNotifier(Notifier):
    """A notifier that accepts registrations only for the event types it was built with.

    Args:
        watchable_events: The event types callbacks may be registered for.
        allow_any: Whether callbacks may also be registered for :attr:`Notifier.ANY`.
    """

    def __init__(self, watchable_events: Iterable[str], allow_any: bool = True) -> None:
        super().__init__()
        self._watchable_events = frozenset(watchable_events)
        self._allow_any = allow_any

    def events_iter(self) -> Iterator[str]:
        """Yield the event types that can be registered for (never :attr:`Notifier.ANY`)."""
        yield from self._watchable_events

    def can_be_registered(self, event_type: str) -> bool:
        """Tell whether ``event_type`` is watchable (or is :attr:`ANY` and that is allowed)."""
        return event_type in self._watchable_events or (
            event_type == self.ANY and self._allow_any
        )


@contextlib.contextmanager
def register_deregister(
    notifier: Notifier,
    event_type: str,
    callback: Callback | None = None,
    args: Iterable[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    details_filter: DetailsFilter | None = None,
) -> Iterator[None]:
    """Register ``callback`` for the duration of a ``with`` block.

    A ``None`` callback registers nothing (unlike :meth:`Notifier.register`, which refuses it),
    so callers can pass an optional callback straight through.
    """
    if callback is None:
        yield
        return
    notifier.register(event_type, callback, args=args, kwargs=kwargs, details_filter=details_filter)
    try:
        yield
    finally:
        notifier.deregister(event_type, callback, details_filter=details_filter)
