"""A request's secret arguments: named in a header so workers and dead letters can mask them.

The engine knows which of a task's arguments are secret (the task's ``secret_args``, and any
argument read from a ``Secret`` store value or from a name another atom reads as secret); a
worker knows only its own task class's ``secret_args``. So every request names its secret
arguments in header :data:`HEADER_SECRET_ARGS` (never in the body, whose schema TaskFlow peers
validate): a worker masks their values in the failure it reports, logs and events, and a dead
letter is parked without them.

While a worker runs a request, its masker is the *current* one of that thread
(:func:`masking`), and :class:`MaskingFilter` on a logging handler masks every record logged
meanwhile, task code's own lines included (``flowengine worker`` installs it on its handlers).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from flowengine.atom import Atom
from flowengine.secrets import Masker

__all__ = ["HEADER_SECRET_ARGS", "MaskingFilter", "for_request", "install_filter", "masker",
           "masking", "names", "task_secret_args"]

#: Request header: the names of the request's arguments whose values are secret (a list).
HEADER_SECRET_ARGS = "x-flowengine-secret-args"
#: Most names a header may list (it is read from untrusted messages).
_MAX_NAMES = 256

#: What the engine side asks to learn a task's secret argument names.
SecretArgs = Callable[[Any], Iterable[str]]


def task_secret_args(task: Atom) -> tuple[str, ...]:
    """The names ``task`` itself marks secret (its ``secret_args``)."""
    return tuple(task.secret_args or ())


def for_request(secret: Iterable[str], arguments: Mapping[str, Any]) -> list[str]:
    """The header value: those of ``secret`` that ``arguments`` holds, sorted."""
    return sorted({name for name in secret if name in arguments})


def names(headers: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The secret argument names ``headers`` list (anything malformed is ignored)."""
    value = (headers or {}).get(HEADER_SECRET_ARGS)
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(n for n in value[:_MAX_NAMES] if isinstance(n, str))


def masker(arguments: Any, secret: Iterable[str], task: Atom | None = None) -> Masker:
    """A masker of the values of ``arguments`` named in ``secret`` (or in ``task``'s
    ``secret_args``); empty when there are none, or ``arguments`` is not a mapping."""
    found = Masker()
    if not isinstance(arguments, Mapping):
        return found
    for name in {*secret, *(task_secret_args(task) if task is not None else ())}:
        value = arguments.get(name)
        if value not in (None, ""):
            found.add(value)
    return found


T = TypeVar("T")

_CURRENT: contextvars.ContextVar[Masker | None] = contextvars.ContextVar(
    "flowengine_request_secrets", default=None)


@contextlib.contextmanager
def masking(secrets: Masker) -> Iterator[None]:
    """Make ``secrets`` the current masker of this thread (context) while the block runs."""
    token = _CURRENT.set(secrets if secrets else None)
    try:
        yield
    finally:
        _CURRENT.reset(token)


async def masked(secrets: Masker, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` with ``secrets`` current in its own context.

    An awaited task runs on the worker's event loop thread beside others: each asyncio task has
    its own copy of the context, so setting it here masks this call's logging and no other's.
    """
    with masking(secrets):
        return await awaitable


class MaskingFilter(logging.Filter):
    """A handler filter that masks the current request's secrets in every record it passes
    (its message, arguments and traceback), whoever logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = _CURRENT.get()
        if secrets is None:
            return True
        try:
            record.msg, record.args = secrets.text(record.getMessage()), None
        except Exception:  # a record that cannot be formatted: leave it to the handler
            return True
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = secrets.text(record.exc_text)
        if record.stack_info:
            record.stack_info = secrets.text(record.stack_info)
        return True


def install_filter(logger: logging.Logger | None = None) -> None:
    """Add :class:`MaskingFilter` to every handler of ``logger`` (default: the root logger)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, MaskingFilter) for f in handler.filters):
            handler.addFilter(MaskingFilter())
